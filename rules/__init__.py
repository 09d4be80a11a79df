"""Built-in kineto-comm rules, one module per rule family; shipped as kineto_comm_builtin_rules.

Every module uses only the public API `kineto_comm.rules_api`. The engine loads the modules
named in MODULES and collects their Rule objects.
"""

MODULES = (
    "capture",
    "exposed_comm",
    "small_messages",
    "interference",
    "straggler",
    "alltoall",
    "bandwidth",
    "topology",
    "pipeline",
    "host",
    "model_deviation",
    "hang",
)
