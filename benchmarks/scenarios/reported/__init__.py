"""Reproductions of memory problems users reported in public issue threads (``rep_*``), each with
its fixed twin (``fix_*``). Labels come from each thread's conclusion: see ``README.md``."""
