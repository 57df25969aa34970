"""Flow control: how much work runs, for whom, and in what order.

- ``limits``: limits shared by every worker (calls in flight, calls and tokens per period);
- ``limit_usage``: what the limiters hold now, against their bounds;
- ``budgets``: per-run budgets of steps, model calls and tokens;
- ``fairness``: fairness and priorities when workers take ready runs;
- ``tenants``: tenants, owners and priorities, and the bounded labels of the metrics.

``Limit`` is re-exported by ``durable``; the rest is imported from its module.
"""
