"""A tiny installed tool that runs the user's module named on its command line, as uvicorn,
gunicorn or pytest do, and allocates on its own too (tests/your_code.rs)."""
