"""Sphinx configuration for the nestbatch docs."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "nestbatch"
author = "the nestbatch developers"
copyright = "2026, the nestbatch developers"
release = "0.1.0"

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.intersphinx"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
# Type names in NumPy-style "Parameters" sections are prose here, not cross-reference targets.
nitpicky = False
suppress_warnings = ["ref.python"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
