"""pool-queue: screen a pool of video multiple-choice items through vision-language models on vLLM.

The data's path, one folder each: inputs (items, frames) -> jobs (plan, queue, lease) -> the worker (the
`workers` package) -> vLLM -> rows -> store -> the next step's queue -> observe (status, report, audit) ->
hub (pack, upload). `launch` starts the servers and workers on a node, `proc` the processes every command
starts, `demo` the synthetic pool and pool-demo's screen, `sim` the simulated vLLM. The modules every stage
uses stay at the top (`__all__`: each folder and top module, with what it holds). The commands in
`pool_queue.commands` are thin: each parses its flags, calls the library and prints.
"""

__all__ = [
    "cli",  # module: the commands' shared flags, settings and error reporting
    "commands",  # folder: the pool-* commands: flags, a library call, printing
    "demo",  # folder: the synthetic pool and pool-demo's screen
    "errors",  # module: PoolError (what a user can act on) and ItemFailure (one item's error row)
    "hub",  # folder: fetching inputs from the hub, packing and uploading the results
    "inputs",  # folder: the item table, the frame folders and their tar shards
    "jobs",  # folder: what a step still needs, the queue contract, a job's life through RQ, rescues
    "launch",  # folder: what pool-launch starts (servers, options, sizes) and the bring-up
    "observe",  # folder: pool-status's view, worker presence, prefix-cache rate, the report, plots, the audit
    "proc",  # folder: child processes, their guard, host locks, progress bars
    "protocol",  # module: protocol v1: prompts, orders, judging, the step graph
    "rows",  # module: the result row and its Arrow schema
    "rq_config",  # module: what `rq info -c pool_queue.rq_config` reads
    "settings",  # module: one Settings object
    "settings_doc",  # module: the settings table in docs/deployment.md (`make docs`)
    "sim",  # folder: the simulated vLLM server
    "store",  # folder: the append-only segment store and its readers' index
    "text",  # module: text that is always valid UTF-8
]
