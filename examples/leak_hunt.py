"""Leak hunt: an order service whose audit trail never forgets.

Each request builds an order, prices it and answers with a JSON document. On the way, the
order's events are dispatched through `functools.singledispatch`, and `audit` keeps a JSON copy
of every order "for the auditors". Nothing ever trims the trail: by the end it holds 4,000
documents, about 9 MB, while everything else a request allocates is freed.

The leaked bytes are allocated inside the standard library's JSON encoder, several calls below
this file's code. Grouped by line, a report names `json/encoder.py`, which is not the bug;
grouped by your code (mprof's default), it names the line of `audit` that keeps the copies,
with the encoder's line beside it:

    mprof record -o leak.mprof -- python3 examples/leak_hunt.py
    mprof report leak.mprof --view live              # audit's line, ← json/encoder.py
    mprof report leak.mprof --view live --by line    # json/encoder.py
    mprof report leak.mprof --view live --by stack   # the whole way down

Runs in about a second; Python 3.8+, standard library only.
"""

import functools
import json

AUDIT_TRAIL = []
REQUESTS = 4000
ITEMS = 40


class Order:
    def __init__(self, number):
        self.number = number
        self.items = [
            {"sku": f"SKU-{number:05d}-{i:02d}", "quantity": 1 + i % 4, "price": 3 + i}
            for i in range(ITEMS)
        ]
        self.total = 0

    def as_dict(self):
        return {"number": self.number, "items": self.items, "total": self.total}


def audit(order):
    # The trail is never trimmed: every document stays.
    AUDIT_TRAIL.append(json.dumps(order.as_dict(), sort_keys=True))  # <- the leak


@functools.singledispatch
def record_event(event):
    raise TypeError(f"no handler for {type(event).__name__}")


@record_event.register
def _(order: Order):
    audit(order)


def checkout(order):
    order.total = sum(item["quantity"] * item["price"] for item in order.items)
    record_event(order)
    return order.as_dict()


def handle_request(number):
    order = Order(number)
    return json.dumps(checkout(order))


def serve():
    answered = 0
    for number in range(REQUESTS):
        answered += len(handle_request(number))
    return answered


if __name__ == "__main__":
    sent = serve()
    print(f"answered {REQUESTS} requests ({sent} bytes); audit trail: {len(AUDIT_TRAIL)} documents")
