"""nn.sdpa's stand-in bookkeeping (nn/attention_routes.py): a layout whose plan one call site
found built is remembered per site, so another site whose first calls torch's attention still
serves asks the registry again (Note [A new layout's first calls]). The registry's answer is a
CPU seam here (``plan_ready``); test_attention_off_path_gpu.py runs the real one."""

import torch

from torch_cudnn_handle.nn import attention_routes
from torch_cudnn_handle.registry import Route
from torch_cudnn_handle.registry.first_calls import at_site, call_site, new_site


def test_a_plan_one_site_found_built_is_not_taken_for_another_sites(monkeypatch):
    first, second = new_site(), new_site()
    asked = []

    def plan_ready(graph_id, operands, stand_in):
        site = call_site(asking=False)
        asked.append(site)
        return site == first  # the first site's count is spent, the second's is not

    monkeypatch.setattr(attention_routes, "plan_ready", plan_ready)
    monkeypatch.setattr(attention_routes, "_ready", set())
    route = Route("cudnn", ("static",), stand_in="torch_attention", stand_in_calls=2)
    q = torch.empty(1, 2, 8, 8)
    for _ in range(2):
        assert at_site(first, attention_routes.torch_stands_in, 7, [q, q, q], route) is False
        assert at_site(second, attention_routes.torch_stands_in, 7, [q, q, q], route) is True
    assert asked == [first, second, second]  # the first site's answer is remembered, the second asks each call
