"""A CSV read by Arrow's own native threads (pyarrow.csv.read_csv, and pandas.read_csv with
engine="pyarrow" when pandas is importable): tests/thread_origins.rs expects their bytes under
"thread started at" the marked lines. Run with ARROW_DEFAULT_MEMORY_POOL=system (malloc).

    python arrow_csv_threads.py DIR
"""
import os
import sys

import pyarrow.csv

path = os.path.join(sys.argv[1], "data.csv")
with open(path, "w") as f:
    f.write("a,b,c\n")
    for i in range(400_000):
        f.write(f"{i},{i * 2},text{i}\n")
table = pyarrow.csv.read_csv(path)  # mark: pyarrow read_csv
try:
    import pandas
except ImportError:
    print("no pandas")
else:
    frame = pandas.read_csv(path, engine="pyarrow")  # mark: pandas read_csv
