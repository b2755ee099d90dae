"""The documents tell the truth about the code.

README.md stays a user's document of at most 400 lines; every relative link in the project's Markdown
pages (and its anchor) resolves; every page of ``docs/`` is reachable from README; and every path,
``python -m`` module, route, setting, metric and error the pages name exists, while the lists that claim
to be complete (the settings table, the metrics table, the error table, the layers) are. The checks are
functions of a page's text, so the last tests can show each one failing on a page made to be wrong.
"""

from __future__ import annotations

import re
from itertools import product
from pathlib import Path

import pytest

from app.api.errors import ERROR_TABLE
from app.settings import Settings
from app.telemetry.metrics import Metrics
from tests.app.test_layering import LAYERS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 400
PAGES = [README, ROOT / "SECURITY.md", ROOT / "deploy" / "README.md", *sorted(DOCS.glob("*.md"))]

# Paths the pages may name that are not in the tree: what the benchmarks write (ignored by git).
OUTPUTS = ("loadtest/results",)
# ZHEMBED_* names that are not settings of the service: docker-compose.yml's own (the published port).
COMPOSE_VARIABLES = frozenset({"ZHEMBED_HTTP_PORT"})
# FastAPI's own routes beside ours.
FRAMEWORK_ROUTES = frozenset({("GET", "/docs"), ("GET", "/redoc"), ("GET", "/openapi.json")})

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
REPO_PATH = re.compile(r"^(?:\./)?(?:app|export|loadtest|tests|deploy|docs|\.ci)/[^\s]*$")
PYTHON_M = re.compile(r"python -m ((?:app|export|loadtest)(?:\.\w+)*)")
SETTING = re.compile(r"\bZHEMBED_[A-Z0-9_]+")
METRIC = re.compile(r"\bzhembed_[a-z0-9_]+")
ROUTE = re.compile(r"\b(GET|POST) (/[\w/{}:.-]*)")
CURL_PATH = re.compile(r"localhost:8080(/[\w/.-]*)")
SERIES_SUFFIXES = ("", "_total", "_bucket", "_sum", "_count", "_created")


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (links and headings there are code, not Markdown)."""
    return FENCE.sub("", text)


def code_spans(text: str) -> list[str]:
    """The inline code of ``text``'s prose, whitespace (a span may wrap a line) folded to one space."""
    return [" ".join(s.split()) for s in INLINE_CODE.findall(prose(text))]


def fenced(text: str) -> str:
    return "\n".join(m.group(0) for m in FENCE.finditer(text))


def slug(heading: str) -> str:
    """The anchor GitHub (and GitLab) gives a heading: lower case, punctuation dropped, spaces to ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page has: its headings' slugs (a repeated one numbered, as GitHub does) and
    explicit ``<a id>``s."""
    seen: dict[str, int] = {}
    found = set(HTML_ANCHOR.findall(text))
    for heading in HEADING.findall(prose(text)):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(text: str) -> list[str]:
    """The link targets of ``text``'s prose (inline and reference links, images too), code left out."""
    body = INLINE_CODE.sub("", prose(text))
    return LINK.findall(body) + REFERENCE.findall(body)


def link_problems(page: Path, text: str) -> list[str]:
    """The relative links of ``page`` that point at no file, or at no anchor of the page they name."""
    problems = []
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        where, _, anchor = target.partition("#")
        path = (page.parent / where).resolve() if where else page
        if not path.exists():
            problems.append(f"{target}: no file {path}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path.read_text()):
            problems.append(f"{target}: {path.name} has no heading with the anchor #{anchor}")
    return problems


def expand(path: str) -> list[str]:
    """``app/engine/{a,b}.py`` as ``app/engine/a.py`` and ``app/engine/b.py``."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in product(*choices)]


def path_problems(text: str, root: Path = ROOT) -> list[str]:
    """The repository paths in ``text``'s inline code (`app/.../x.py`, `deploy/`, globs) that match
    nothing in the tree. A path with a placeholder (`tests/app/<package>/...`) is a pattern, not a path."""
    problems = []
    for span in code_spans(text):
        if not REPO_PATH.match(span) or "<" in span:
            continue
        for path in expand(span.removeprefix("./")):
            if path.rstrip("/").startswith(OUTPUTS):
                continue
            if not (any(root.glob(path.rstrip("/"))) if "*" in path else (root / path).exists()):
                problems.append(path)
    return problems


def module_problems(text: str, root: Path = ROOT) -> list[str]:
    """The ``python -m`` modules of ours that ``text`` names (in prose or code) and that do not exist."""
    missing = []
    for name in PYTHON_M.findall(text):
        base = root / name.replace(".", "/")
        if not (base.with_suffix(".py").exists() or (base / "__main__.py").exists()):
            missing.append(name)
    return missing


def served_routes() -> set[tuple[str, str]]:
    """Every (method, path) the HTTP app serves, path parameters written as ``{}``."""
    from app.api.http import openai_routes, retrieval_routes, routes

    served = set(FRAMEWORK_ROUTES)
    for route in [*routes.router.routes, *openai_routes.router.routes, *retrieval_routes.router.routes]:
        for method in getattr(route, "methods", None) or ():
            served.add((method, route_shape(getattr(route, "path", ""))))
    return served


def route_shape(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


def route_problems(text: str, served: set[tuple[str, str]]) -> list[str]:
    """``GET /x`` / ``POST /x`` that the app does not serve, and curl examples of paths it has no route
    for."""
    problems = [
        f"{method} {path}"
        for method, path in ROUTE.findall(" ".join(text.split()))
        if (method, route_shape(path.rstrip("."))) not in served
    ]
    paths = {path for _, path in served}
    problems += [f"curl {p}" for p in CURL_PATH.findall(fenced(text)) if route_shape(p) not in paths]
    return problems


def setting_names() -> set[str]:
    return {"ZHEMBED_" + name.upper() for name in Settings.model_fields}


def setting_problems(text: str) -> list[str]:
    """``ZHEMBED_*`` names in ``text`` that are no setting of the service."""
    known = setting_names() | COMPOSE_VARIABLES
    return sorted({name for name in SETTING.findall(text) if name not in known})


def metric_names() -> set[str]:
    """Every metric as a scrape names it: counters with their ``_total``."""
    return {
        family.name + ("_total" if family.type == "counter" else "")
        for family in Metrics().registry.collect()
    }


def metric_problems(text: str) -> list[str]:
    """``zhembed_*`` names in ``text`` that are no series of the service's metrics."""
    families = {name.removesuffix("_total") for name in metric_names()}
    series = {f + suffix for f in families for suffix in SERIES_SUFFIXES}
    return sorted({m for m in METRIC.findall(text) if m not in series and not m.startswith("zhembed_pb2")})


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row in ``text`` (header and separator rows included)."""
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in prose(text).splitlines()
        if line.lstrip().startswith("|")
    ]


def section(text: str, heading: str) -> str:
    """The part of ``text`` under the ``## heading`` named, up to the next heading of that level."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no section '## {heading}'"
    return match.group(1)


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# --- the pages ------------------------------------------------------------------------------------


def test_readme_is_short() -> None:
    lines = len(read(README).splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page: Path) -> None:
    assert not link_problems(page, read(page))


def test_every_docs_page_is_linked_from_readme() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(read(README))}
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"docs pages README.md does not link: {unlinked}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_paths_and_modules_exist(page: Path) -> None:
    text = read(page)
    assert not path_problems(text)
    assert not module_problems(text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_routes_settings_and_metrics_exist(page: Path) -> None:
    text = read(page)
    assert not route_problems(text, served_routes())
    assert not setting_problems(text)
    assert not metric_problems(text)


def test_readme_lists_every_route() -> None:
    mentioned = {route_shape(p) for _, p in ROUTE.findall(" ".join(section(read(README), "Routes").split()))}
    mentioned |= {route_shape(s) for s in code_spans(section(read(README), "Routes")) if s.startswith("/")}
    served = {path for _, path in served_routes()} - {"/redoc", "/openapi.json"}
    assert not served - mentioned, f"routes README.md's table leaves out: {sorted(served - mentioned)}"


def test_every_setting_has_a_row() -> None:
    rows = {row[0].strip("`") for row in table_rows(section(read(DOCS / "deployment.md"), "Settings"))}
    assert not setting_names() - rows, f"settings without a row: {sorted(setting_names() - rows)}"


def test_every_metric_has_a_row() -> None:
    rows = " ".join(row[0] for row in table_rows(section(read(DOCS / "observability.md"), "Metrics")))
    named = set(METRIC.findall(rows))
    assert not metric_names() - named, f"metrics without a row: {sorted(metric_names() - named)}"


def test_the_error_table_is_the_code_s() -> None:
    documented = {
        tuple(cell.strip("`") for cell in row[:4])
        for row in table_rows(section(read(DOCS / "api.md"), "Errors"))
        if row[0].isdigit()
    }
    declared = {(str(r.status), r.error_type, r.grpc, r.openai_type) for r in ERROR_TABLE.values()}
    assert documented == declared


def test_architecture_has_one_diagram_and_the_layers_of_the_code() -> None:
    text = read(DOCS / "architecture.md")
    assert len(re.findall(r"^```mermaid$", text, re.M)) == 1
    rows = [r for r in table_rows(section(text, "The layers")) if r[0].isdigit()]
    documented = [
        {span.rstrip("/").removesuffix(".py").replace("/", ".") for span in INLINE_CODE.findall(row[1])}
        for row in sorted(rows, key=lambda r: int(r[0]))
    ]
    declared = [set(row) - {"app"} for row in LAYERS]
    assert documented == [row for row in declared if row]
    packages = {p.parent.relative_to(ROOT).as_posix() + "/" for p in (ROOT / "app").rglob("__init__.py")}
    assert not {p for p in packages if f"`{p}" not in text} - {"app/"}, "a package of app/ is not named"


# --- the checks themselves -------------------------------------------------------------------------


def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text)
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## Its `python -m x`: part\n")
    return page


def test_the_link_check_sees_missing_files_and_anchors(tmp_path: Path) -> None:
    text = (
        "# Page\n\n## A section\n\n"
        "[ok](other.md) [ok](other.md#its-python--m-x-part) [ok](#a-section) [web](https://example.com)\n"
        "[gone](missing.md) [no anchor](other.md#nowhere) [here](#nothing)\n"
        "`[not a link](missing-too.md)`\n```\n[in code](missing-three.md)\n```\n"
    )
    problems = link_problems(_page(tmp_path, text), text)
    assert [p.split(":")[0] for p in problems] == ["missing.md", "other.md#nowhere", "#nothing"]


def test_slugs_are_githubs() -> None:
    assert slug("Vectors: `POST /embed` and `POST /`") == "vectors-post-embed-and-post-"
    assert slug("`python -m loadtest.soak`") == "python--m-loadtestsoak"
    assert slug("Combining layers: `layer_combine`") == "combining-layers-layer_combine"
    assert anchors("# A\n## A\n") == {"a", "a-1"}


def test_the_path_and_module_checks_see_what_is_missing() -> None:
    text = (
        "`app/engine/{admission,nowhere}.py` `app/api/rpc/proto/*.proto` `app/nothing/*.py` "
        "`tests/app/<package>/test_<module>.py` `loadtest/results/` `deploy/overlays/gpu`\n"
        "python -m loadtest.soak, python -m loadtest.nothing, python -m app, python -m pip\n"
    )
    assert path_problems(text) == ["app/engine/nowhere.py", "app/nothing/*.py"]
    assert module_problems(text) == ["loadtest.nothing"]


def test_the_route_setting_and_metric_checks_see_unknown_names() -> None:
    served = served_routes()
    text = (
        "`POST /embed`, `GET /v1/models/{name}`, `GET /embed` and `POST\n/nothing`.\n"
        "```bash\ncurl localhost:8080/fill-mask\ncurl localhost:8080/fil-mask\n```\n"
        "ZHEMBED_MAX_BATCH_SIZE ZHEMBED_HTTP_PORT ZHEMBED_MAX_BATCH_SIZES\n"
        "zhembed_requests_total zhembed_batch_size_bucket zhembed_request_total zhembed_pb2.py\n"
    )
    assert route_problems(text, served) == ["GET /embed", "POST /nothing", "curl /fil-mask"]
    assert setting_problems(text) == ["ZHEMBED_MAX_BATCH_SIZES"]
    assert metric_problems(text) == ["zhembed_request_total"]


def test_table_rows_and_sections_read_what_the_checks_compare() -> None:
    text = "## Settings\n\n| variable | what |\n|---|---|\n| `ZHEMBED_PORT` | x |\n## Next\n| b | c |\n"
    assert [r[0] for r in table_rows(section(text, "Settings"))] == ["variable", "---", "`ZHEMBED_PORT`"]
    with pytest.raises(AssertionError, match="no section"):
        section(text, "Nothing")
