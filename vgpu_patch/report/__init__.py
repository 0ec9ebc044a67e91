"""How every layer reports: the error classes and their exit codes (errors), and the one -v level (verbosity)."""
