"""Processes on this host: starting and stopping children and an embedded Redis (`procs`), the guard that
stops them when the command that started them dies (`guard`), one command per root at a time (`hostlock`) and
progress bars and durations (`progress`)."""
