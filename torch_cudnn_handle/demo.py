"""The demo ``python -m torch_cudnn_handle`` runs after its report (see issue 4)."""


def main() -> int:
    print("\n(demo: not written yet)")
    return 0
