"""Checkers of answers and programs: call harnesses, math answer checking and its workers."""
