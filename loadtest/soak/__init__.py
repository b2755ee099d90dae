"""The soak: 80% of measured capacity held for minutes, the memory of every process of the server
watched, faults put in if asked for (``python -m loadtest.soak``, :mod:`.__main__`).

- :mod:`.open_loop`: the open loop of requests, the memory readings and the faults' actions;
- :mod:`.faults`: the faults' schedule, the Redis they stop, the workers' slots, every request's fate;
- :mod:`.report`: what the soak found and its verdict, and how it prints.
"""
