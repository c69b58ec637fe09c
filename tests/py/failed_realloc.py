"""A realloc that fails: the bytearray made in keeper() asks to grow by a petabyte-scale
factor, PyObject_Realloc returns NULL, Python raises MemoryError, and the old block stays
(and stays allocated) as it was. Prints the bytearray's length at the end."""


def keeper():
    return bytearray(100_000)


b = keeper()
try:
    b *= 1 << 45
except MemoryError:
    pass
print(len(b))
