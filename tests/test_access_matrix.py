"""Who may reach what: every URL × anonymous, owner, another player, staff.

The matrix is built from the URL resolver (pages, htmx partials, exports) and from the OpenAPI
schema (API routes), so a new URL is covered the day it lands; a new kind of path parameter
fails here until `World.ids` knows it. Public URLs are listed in PUBLIC with the reason.

- anonymous: pages redirect to the login page; API routes answer 401;
- another player (and staff, outside the admin): 404 for anything of the owner's, also when
  the owner's object is smuggled under their own adventure's URL;
- the owner: reaches everything (never 403/404/5xx);
- staff: reach the admin, and see players' stories only there;
- CSRF: every state-changing browser request without the token is refused with 403.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import URLResolver, get_resolver, reverse

from stories import tree, turns
from stories.models import ApiToken, Memory, TurnJob, WorldEntry

pytestmark = pytest.mark.django_db(transaction=True)

LOGIN = "/accounts/login/"
ADMIN_LOGIN = "/admin/login/"

# Routes anyone may reach, and why.
PUBLIC = {
    "healthz": "health probe for load balancers; says only up/down",
    "accounts/signup/": "creating an account",
    "accounts/login/": "signing in",
    "accounts/logout/": "signing out (POST, CSRF-protected)",
    "accounts/password_reset/": "password reset request: no data without the mailed token",
    "accounts/password_reset/done/": "static confirmation",
    "accounts/reset/<uidb64>/<token>/": "guarded by the signed one-time token itself",
    "accounts/reset/done/": "static confirmation",
    "api/v1/openapi.json": "the API's schema: no data",
    "api/v1/docs": "the API's documentation page: no data",
}
# Route prefixes checked elsewhere in this file (the API through its schema, the admin through its registry).
CHECKED_ELSEWHERE = ("api/v1/", "admin/")
MUTATING = ("POST", "PUT", "PATCH", "DELETE")


@dataclass
class World:
    owner: object
    other: object
    staff: object
    ids: dict[str, int]  # the owner's objects, by path parameter name
    other_ids: dict[str, int]  # the other player's own objects
    owner_token: str
    other_token: str
    staff_token: str


def objects_of(user, title: str) -> dict[str, int]:
    adventure = tree.adventure_create(owner=user, title=title, premise="A harbour at dusk.", persona="A sailor.")
    job, _ = turns.turn_request(adventure=adventure, kind="do", text="I look around.", expected_version=1)
    turns.turn_request(adventure=adventure, kind="retry", expected_version=2)
    adventure.refresh_from_db()
    head = adventure.head
    memory = Memory.objects.create(adventure=adventure, branch=head.branch, depth=head.depth, text="Gulls circle.")
    entry = WorldEntry.objects.create(adventure=adventure, keys=["harbour"], content="The harbour master is corrupt.")
    token, _ = ApiToken.issue(user, name="page token")
    return {
        "adventure_id": adventure.pk,
        "node_id": head.pk,
        "branch_id": head.branch_id,
        "job_id": TurnJob.objects.get(pk=job.pk).pk,
        "memory_id": memory.pk,
        "entry_id": entry.pk,
        "token_id": token.pk,
    }


@pytest.fixture
def world(django_user_model, redis_url) -> World:
    owner = django_user_model.objects.create_user("owner", password="correct horse battery")
    other = django_user_model.objects.create_user("other", password="correct horse battery")
    staff = django_user_model.objects.create_user(
        "operator", password="correct horse battery", is_staff=True, is_superuser=True
    )
    return World(
        owner=owner,
        other=other,
        staff=staff,
        ids=objects_of(owner, "Owner's secret story"),
        other_ids=objects_of(other, "Other's story"),
        owner_token=ApiToken.issue(owner)[1],
        other_token=ApiToken.issue(other)[1],
        staff_token=ApiToken.issue(staff)[1],
    )


def logged_in(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


# --- pages, partials and exports, from the resolver ----------------------------------------------


def routes(patterns=None, prefix: str = ""):
    """(route, name) for every URL pattern, with its full route string."""
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(pattern, URLResolver):
            yield from routes(pattern.url_patterns, prefix + str(pattern.pattern))
        else:
            yield prefix + str(pattern.pattern), pattern.name


PARAM = re.compile(r"<(?:(?P<converter>\w+):)?(?P<name>\w+)>")


def fill(route: str, ids: dict[str, int]) -> str:
    def value(match: re.Match) -> str:
        name = match["name"]
        assert name in ids, f"{route}: no object for <{name}>; teach objects_of() about it"
        return str(ids[name])

    return "/" + PARAM.sub(value, route)


def page_routes() -> list[str]:
    found = []
    for route, _name in routes():
        if route in PUBLIC or route.startswith(CHECKED_ELSEWHERE):
            continue
        found.append(route)
    assert len(found) >= 20, found
    return found


def methods_of(client: Client, url: str) -> list[str]:
    """The methods a page answers: GET, or what its 405 allows."""
    response = client.get(url)
    if response.status_code != 405:
        return ["GET"]
    return [m.strip() for m in response["Allow"].split(",") if m.strip() not in ("HEAD", "OPTIONS")]


def send(client: Client, method: str, url: str, version: int = 3):
    """`version`: a current expected_version (each world's adventures stand at 3), so head moves
    get past their form check to the lookups this matrix is about."""
    data = b"" if method == "GET" else f"expected_version={version}".encode()
    return client.generic(method, url, data, content_type="application/x-www-form-urlencoded")


def test_every_page_is_private_to_its_owner(world):
    failures: list[str] = []
    anonymous, other, staff = Client(), logged_in(world.other), logged_in(world.staff)
    for route in page_routes():
        url = fill(route, world.ids)
        has_objects = bool(PARAM.search(route))
        for method in methods_of(logged_in(world.owner), url):
            got = send(anonymous, method, url)
            if not (got.status_code == 302 and got["Location"].startswith(LOGIN)):
                failures.append(f"anonymous {method} {url}: {got.status_code}, not a redirect to the login page")
            if has_objects:
                for who, client in (("another player", other), ("staff", staff)):
                    got = send(client, method, url)
                    if got.status_code != 404:
                        failures.append(f"{who} {method} {url}: {got.status_code}, not 404")
                # The owner's object under the other player's own adventure: still not theirs.
                if "adventure_id" in route and len(PARAM.findall(route)) > 1:
                    mixed = fill(route, {**world.ids, "adventure_id": world.other_ids["adventure_id"]})
                    got = send(other, method, mixed)
                    if got.status_code != 404:
                        failures.append(
                            f"another player {method} {mixed} (own story, owner's object): {got.status_code}"
                        )
        # The owner reaches it: GET pages render, POSTs are handled (never refused or missing).
        for method in methods_of(logged_in(world.owner), url):
            got = send(logged_in(world.owner), method, url)
            if got.status_code in (403, 404) or got.status_code >= 500:
                failures.append(f"owner {method} {url}: {got.status_code}")
    assert not failures, "\n".join(failures)


def test_lists_show_only_the_players_own_stories(world):
    for user in (world.other, world.staff):
        page = logged_in(user).get("/").content.decode()
        assert "Owner&#x27;s secret story" not in page and "Owner's secret story" not in page
    assert "Owner&#x27;s secret story" in logged_in(world.owner).get("/").content.decode()


# --- the API, from its OpenAPI schema ------------------------------------------------------------


def schema() -> dict:
    return Client().get("/api/v1/openapi.json").json()


def example(spec: dict, components: dict):
    """A minimal body that satisfies `spec`, so validation never answers before the lookup."""
    if "$ref" in spec:
        return example(components[spec["$ref"].rsplit("/", 1)[-1]], components)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in spec:
            return example(spec[key][0], components)
    kind = spec.get("type")
    if kind == "object" or "properties" in spec:
        return {name: example(sub, components) for name, sub in spec.get("properties", {}).items()
                if name in spec.get("required", [])}  # fmt: skip
    if kind == "array":
        return []
    if kind == "integer":
        return 1
    if kind == "boolean":
        return False
    if kind == "string":
        return "x" * max(spec.get("minLength", 1), 1) if spec.get("enum") is None else spec["enum"][0]
    return None


def api_operations() -> list[tuple[str, str, object]]:
    spec = schema()
    components = spec.get("components", {}).get("schemas", {})
    found = []
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            body = None
            content = operation.get("requestBody", {}).get("content", {})
            if "application/json" in content:
                body = example(content["application/json"]["schema"], components)
            found.append((method.upper(), path, body))
    assert len(found) >= 25
    # Deletions last, the whole adventure's very last: the owner's pass must not remove what later rows use.
    return sorted(found, key=lambda op: (op[0] == "DELETE", op[1] == "/api/v1/adventures/{adventure_id}"))


def call(method: str, url: str, body, token: str | None = None, client: Client | None = None):
    client = client or Client()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if body is None:
        return client.generic(method, url, headers=headers)
    return client.generic(method, url, data=__import__("json").dumps(body), content_type="application/json",
                          headers=headers)  # fmt: skip


def test_every_api_route_is_private_to_its_owner(world):
    failures: list[str] = []
    for method, path, body in api_operations():
        url = PARAM.sub(lambda m: str(world.ids[m["name"]]), path.replace("{", "<").replace("}", ">"))
        got = call(method, url, body)
        if got.status_code != 401 or got.json()["error"]["code"] != "unauthorized":
            failures.append(f"anonymous {method} {url}: {got.status_code} {got.content[:100]!r}")
        if "{" in path:
            for who, token in (("another player", world.other_token), ("staff", world.staff_token)):
                got = call(method, url, body, token)
                if got.status_code != 404:
                    failures.append(f"{who} {method} {url}: {got.status_code} {got.content[:100]!r}")
        got = call(method, url, body, world.owner_token)
        if got.status_code in (401, 403, 404) or got.status_code >= 500:
            failures.append(f"owner {method} {url}: {got.status_code} {got.content[:100]!r}")
    assert not failures, "\n".join(failures)


def test_the_api_lists_only_the_callers_own_stories(world):
    for token in (world.other_token, world.staff_token):
        listed = call("GET", "/api/v1/adventures", None, token).json()["adventures"]
        assert world.ids["adventure_id"] not in [a["id"] for a in listed]


def test_every_api_route_in_the_resolver_is_in_the_schema():
    documented = {re.sub(r"\{(\w+)\}", r"<\1>", path).lstrip("/") for path in schema()["paths"]}
    documented = {f"api/v1/{path.removeprefix('api/v1/')}" for path in documented}
    for route, name in routes():
        if route.startswith("api/v1/") and route not in PUBLIC and name != "api-root":
            assert route in documented, f"{route} is served but not in the OpenAPI schema"


# --- the admin ---------------------------------------------------------------------------------


def admin_urls(world) -> list[str]:
    urls = [reverse("admin:index"), reverse("admin:storytree_dashboard")]
    for model in admin.site._registry:
        opts = model._meta
        urls.append(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
        instance = model._default_manager.order_by("pk").first()
        if instance is not None:
            urls.append(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[instance.pk]))
    return urls


def test_the_admin_is_for_staff_only(world):
    failures = []
    urls = admin_urls(world)
    assert any("/stories/adventure/" in url for url in urls)
    for url in urls:
        for who, client in (("anonymous", Client()), ("owner", logged_in(world.owner))):
            got = client.get(url)
            if not (got.status_code == 302 and got["Location"].startswith(ADMIN_LOGIN)):
                failures.append(f"{who} GET {url}: {got.status_code}")
        got = logged_in(world.staff).get(url)
        if got.status_code != 200:
            failures.append(f"staff GET {url}: {got.status_code}")
    assert not failures, "\n".join(failures)
    # Through the admin, staff do see the players' stories.
    page = logged_in(world.staff).get(reverse("admin:stories_adventure_changelist")).content.decode()
    assert "Owner&#x27;s secret story" in page


# --- CSRF ----------------------------------------------------------------------------------------


def test_every_state_changing_browser_request_needs_the_csrf_token(world):
    failures = []
    owner = logged_in(world.owner, enforce_csrf_checks=True)
    for route, _name in routes():
        if route.startswith(CHECKED_ELSEWHERE) or "<uidb64>" in route:
            continue
        url = fill(route, world.ids)
        for method in methods_of(logged_in(world.owner), url):
            if method in MUTATING:
                got = send(owner, method, url)
                if got.status_code != 403:
                    failures.append(f"{method} {url} without a CSRF token: {got.status_code}")
    # The API through the browser's session: the same rule (a bearer token needs no CSRF token).
    for method, path, body in api_operations():
        if method in MUTATING:
            url = PARAM.sub(lambda m: str(world.ids[m["name"]]), path.replace("{", "<").replace("}", ">"))
            got = call(method, url, body, client=owner)
            if got.status_code != 403:
                failures.append(f"API {method} {url} with a session and no CSRF token: {got.status_code}")
    # The admin's forms too.
    staff = logged_in(world.staff, enforce_csrf_checks=True)
    for url in admin_urls(world):
        if "/change/" in url or url.endswith("/stories/adventure/"):
            got = staff.post(url, {})
            if got.status_code != 403:
                failures.append(f"admin POST {url} without a CSRF token: {got.status_code}")
    assert not failures, "\n".join(failures)
