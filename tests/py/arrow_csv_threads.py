"""A CSV read by Arrow's own native threads: with CSV_READER=pyarrow (the default)
pyarrow.csv.read_csv, with CSV_READER=pandas pandas.read_csv(engine="pyarrow"), each in a
process of its own (Arrow starts its pool's threads at the first read: a second read's threads
were started by the first). tests/thread_origins.rs expects their bytes under "thread started
at" the marked line. Run with ARROW_DEFAULT_MEMORY_POOL=system (malloc).

    python arrow_csv_threads.py DIR
"""
import os
import sys

path = os.path.join(sys.argv[1], "data.csv")
with open(path, "w") as f:
    f.write("a,b,c\n")
    for i in range(400_000):
        f.write(f"{i},{i * 2},text{i}\n")
if os.environ.get("CSV_READER", "pyarrow") == "pyarrow":
    import pyarrow.csv

    table = pyarrow.csv.read_csv(path)  # mark: pyarrow read_csv
else:
    import pandas

    frame = pandas.read_csv(path, engine="pyarrow")  # mark: pandas read_csv
