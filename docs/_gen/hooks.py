"""MkDocs hooks (``hooks:`` in mkdocs.yml): generated pages, placeholders, docstring roles.

* ``on_config``: appends the generated environment and API pages to the navigation.
* ``on_files``: adds those pages (built by :mod:`docgen` from the code) to the site.
* ``on_page_markdown``: replaces ``<!-- generate: NAME -->`` in hand-written pages.
* ``on_page_content``: turns the reStructuredText roles that docstrings use (``:func:`x```, which
  Markdown renders as ``:func:<code>x</code>``) into cross-references where the target is
  documented, plain code otherwise; and ``text::`` endings into ``text:``.
"""

from __future__ import annotations

import html
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files


def _load_docgen() -> Any:
    name = "llm_zoo_docgen"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("docgen.py"))
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


docgen = _load_docgen()


def _section(nav: list[Any], title: str) -> list[Any]:
    for entry in nav:
        if isinstance(entry, dict) and title in entry:
            if not isinstance(entry[title], list):
                entry[title] = [entry[title]]
            return entry[title]
    raise KeyError(f"mkdocs.yml: the nav has no section {title!r} for the generated pages")


def on_config(config: Any) -> Any:
    nav = config["nav"]
    environments = _section(nav, "Environments")
    for env_id in docgen.builtin_envs():
        environments.append({env_id: docgen.env_page_path(env_id)})
    api = _section(nav, "API reference")
    for module, title in docgen.API_MODULES:
        api.append({title: docgen.api_page_path(module)})
    return config


def on_files(files: Files, config: Any) -> Files:
    for env_id in docgen.builtin_envs():
        files.append(File.generated(config, docgen.env_page_path(env_id), content=docgen.env_page(env_id)))
    for module, _ in docgen.API_MODULES:
        files.append(File.generated(config, docgen.api_page_path(module), content=docgen.api_page(module)))
    return files


_PLACEHOLDER = re.compile(r"<!--\s*generate:\s*([\w-]+)\s*-->")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match[1]
        if name not in docgen.PLACEHOLDERS:
            raise KeyError(
                f"{page.file.src_uri}: unknown placeholder {name!r}; known: {sorted(docgen.PLACEHOLDERS)}"
            )
        return docgen.PLACEHOLDERS[name]()

    return _PLACEHOLDER.sub(replace, markdown)


_ROLE_HTML = re.compile(r":(mod|func|class|meth|data|attr|exc|obj):<code>(~?)([^<]+)</code>")


def _page_module(page: Any) -> str | None:
    """The module a generated page documents (for names relative to it), if any."""
    uri = page.file.src_uri
    if uri.startswith("api/"):
        return uri.removeprefix("api/").removesuffix(".md")
    if uri.startswith("environments/"):
        env_id = uri.removeprefix("environments/").removesuffix(".md")
        entry = docgen.builtin_envs().get(env_id, ("",))[0]
        return entry.partition(":")[0] or None
    return None


def on_page_content(content: str, page: Any, config: Any, files: Files) -> str:
    module = _page_module(page)

    def replace(match: re.Match[str]) -> str:
        short, target = match[2] == "~", html.unescape(match[3])
        shown = target.split(".")[-1] if short else target
        # An optional autoref: a link when mkdocstrings documents the target, plain code otherwise.
        # The slug is autorefs' second candidate: the name relative to the page's module.
        relative = f' slug="{html.escape(f"{module}.{target}")}"' if module else ""
        return (
            f'<autoref identifier="{html.escape(target)}"{relative} optional>'
            f"<code>{html.escape(shown)}</code></autoref>"
        )

    content = _ROLE_HTML.sub(replace, content)
    return re.sub(r"::</p>", ":</p>", content)
