"""Helpers the tests share: tests import these, never another test module."""
