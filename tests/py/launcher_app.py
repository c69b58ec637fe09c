"""The user's module that tests/py/launcher_pkg runs (copied into the test's project as
app.py): 20 MB kept at the line marked USER LINE."""
KEEP = []


def run():
    for _ in range(400):
        KEEP.append(bytes(50000))  # USER LINE
