"""Ollama's Go ``text/template`` prompt templates, interpreted in Python."""

from .gotemplate import TemplateError as TemplateError
from .gotemplate import is_go_template as is_go_template
from .gotemplate import parse as parse
from .gotemplate import render_prompt as render_prompt

__all__ = ["TemplateError", "is_go_template", "parse", "render_prompt"]
