import sys
def work(n):
    keep = []
    for i in range(n):
        s = bytes(200)
        t = [i, i, i]
    return keep
def deep(d, n):
    if d == 0:
        return work(n)
    return deep(d - 1, n)
deep(int(sys.argv[2]) if len(sys.argv) > 2 else 28, int(sys.argv[1]))
