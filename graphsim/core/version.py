"""graphsim's version (pyproject.toml's ``version``): recorded in every result's identity."""
__version__ = "0.1.0"
