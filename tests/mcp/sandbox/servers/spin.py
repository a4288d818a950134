"""``spin.py``: burns CPU until its CPU-time limit stops it."""

while True:
    pass
