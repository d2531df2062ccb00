"""MkDocs hook: pages may link to files of the repository outside docs/ (figures and reports in
results/, benchmarks/README.md, experiments/*.yaml) with the relative path that works when the
Markdown is read in the repository. The hook adds those files to the site under their repository
path and rewrites such links to point there, so `mkdocs build --strict` checks them like any other
link instead of warning that they leave the docs folder."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

# Repository files the site serves beside the pages (globs relative to the repository root).
# (No README.md: MkDocs would publish it as the folder's index.html, over the page of the same name.)
SERVED = ("results/*/REPORT.md", "results/*/PILOT.md", "results/*/PLAN.md", "results/*/figures/*.png")

_LINK = re.compile(r"(\]\()([^)\s]+)(\))")


def _repo_root(config) -> Path:
    return Path(config["docs_dir"]).resolve().parent


def on_files(files, config):
    root = _repo_root(config)
    for pattern in SERVED:
        for path in sorted(root.glob(pattern)):
            files.append(File.generated(config, path.relative_to(root).as_posix(), abs_src_path=str(path)))
    return files


def on_page_markdown(markdown, page, config, files):
    depth = page.file.src_uri.count("/")  # folders between docs/ and the page

    def rewrite(m: re.Match) -> str:
        target = m.group(2)
        if "://" in target or target.startswith(("#", "/")):
            return m.group(0)
        # Relative to the repository root, as the link reads in the repository.
        in_repo = posixpath.normpath(posixpath.join("docs", posixpath.dirname(page.file.src_uri), target))
        if in_repo.startswith("docs/") or in_repo.startswith(".."):
            return m.group(0)
        return f"{m.group(1)}{'../' * depth}{in_repo}{m.group(3)}"

    return _LINK.sub(rewrite, markdown)
