"""Loaded by pytest for every test, the notebooks under nbval included.

Stored notebook outputs are compared to within one unit of each decimal number's last printed
digit (tests/nbval_numbers.py), after the sanitizing of tests/nbval_sanitize.cfg.
"""
from tests import nbval_numbers

nbval_numbers.install()
