"""Ollama's Go ``text/template`` prompt templates, interpreted in Python.

A Modelfile ``TEMPLATE`` is Go template syntax.  The package covers the subset Ollama's
templates use: text and ``{{ }}`` actions with ``{{-``/``-}}`` trimming, comments, fields
(``.Messages``, ``$.Tools``, ``$m.Role``), variables (``:=``, ``=``), pipelines,
``if``/``else if``/``else``, ``range`` (with ``else``, ``break``, ``continue``), ``with``,
Go's built-in functions (less ``call``, ``html``, ``js``, ``urlquery``) and Ollama's
``json``.  Text goes through :mod:`.lexer` and :mod:`.parser` to a :class:`GoTemplate`
(:mod:`.interpreter`), which prints values as :mod:`.values` says with the functions of
:mod:`.functions`; :func:`render_prompt` (:mod:`.prompt`) is Ollama's ``template.Execute``.
"""

from .errors import TemplateError as TemplateError
from .interpreter import GoTemplate as GoTemplate
from .interpreter import parse as parse
from .prompt import collate as collate
from .prompt import is_go_template as is_go_template
from .prompt import render_prompt as render_prompt

__all__ = ["GoTemplate", "TemplateError", "collate", "is_go_template", "parse", "render_prompt"]
