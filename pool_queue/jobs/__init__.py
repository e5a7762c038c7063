"""The work in Redis: which items a step still needs (`plan`), putting them on the queue as chunk jobs
(`produce`, `steps`), the queue contract (`queue`: screens, `ChunkJob`, one snapshot of every job), a job's life
through RQ (`lease`) and the jobs whose worker died sent again (`rescue`)."""
