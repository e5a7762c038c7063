"""pool-queue: screen a pool of video multiple-choice items through vision-language models on vLLM.

The data's path, one module each: items -> plan -> queue (+ lease) -> worker (the `workers` package)
-> vLLM -> rows -> store -> the next step's queue -> status, report, audit, export. The commands in
`pool_queue.commands` are thin: each parses its flags, calls these modules and prints.
"""

__all__ = [
    "audit",  # checks a results root before packing
    "cli",  # the commands' shared flags, settings and error reporting
    "errors",  # PoolError (what a user can act on) and ItemFailure (one item's error row)
    "frames",  # the frame rule, 448-px JPEG encoding
    "items",  # loading and validating the item table
    "launch",  # what pool-launch starts: servers, their options, ports
    "lease",  # a job's life through RQ's public API
    "plan",  # eligible - settled - held; the chain rule
    "prefix_cache",  # vLLM's prefix-cache hit rate per step
    "presence",  # each worker's short-lived snapshot in Redis
    "produce",  # the producer: a step's remaining items into Redis
    "protocol",  # protocol v1: prompts, orders, judging, the step graph
    "queue",  # the queue contract: screens, chunk jobs, one snapshot of every job
    "report",  # the report's numbers
    "rows",  # the result row and its Arrow schema
    "settings",  # one Settings object
    "status",  # pool-status's view
    "store",  # the append-only store
]
