"""The soak (``python -m loadtest.soak``): :mod:`.open_loop` sends the requests, reads the server's memory
and acts out the faults; :mod:`.faults` schedules them and gives every request its fate; :mod:`.report`
draws the verdict and prints it."""
