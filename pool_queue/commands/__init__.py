"""The pool-* commands: each parses its flags, calls the library and prints; no command imports
another."""
