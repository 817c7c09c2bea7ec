"""Who a client is (``dynlogits.serve.frontend.identity``) and who may call at all (API keys).

A client is its peer address: a forwarding header is believed only from a proxy the operator listed,
read from its right end, so a client naming itself in ``X-Forwarded-For`` is still itself. With API
keys, ``/v1/`` routes need one (401 otherwise, as ``vllm serve --api-key`` answers) and a client is its
key. The resolution alone, then a real frontend process (its worker never comes up) with the real
``openai`` client.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from deploy.launcher import FrontendProcess, free_port_block, frontend_process

from dynlogits.serve.frontend.identity import ClientIdentity, TrustedProxies
from dynlogits.serve.http.bearer_auth import BearerKeys


def _scope(peer: str, *headers: tuple[str, str]) -> dict[str, Any]:
    return {"client": (peer, 40000), "headers": [(n.lower().encode(), v.encode()) for n, v in headers]}


PROXY = TrustedProxies.parse("127.0.0.1, 10.0.0.0/8")


@pytest.mark.parametrize(("peer", "headers", "client"), [
    ("127.0.0.1", [], "127.0.0.1"),
    ("192.0.2.7", [("x-forwarded-for", "203.0.113.9")], "192.0.2.7"),  # not a listed proxy: ignored
    ("127.0.0.1", [("x-forwarded-for", "203.0.113.9")], "203.0.113.9"),
    ("127.0.0.1", [("x-forwarded-for", "1.1.1.1, 2.2.2.2, 203.0.113.9")], "203.0.113.9"),  # spoofed hops left
    ("127.0.0.1", [("x-forwarded-for", "1.1.1.1, 203.0.113.9, 10.1.2.3")], "203.0.113.9"),  # past a 2nd proxy
    ("127.0.0.1", [("x-forwarded-for", "1.1.1.1"), ("x-forwarded-for", "203.0.113.9")], "203.0.113.9"),
    ("127.0.0.1", [("x-forwarded-for", "10.0.0.5, 10.0.0.6")], "10.0.0.5"),  # all proxies: the leftmost
    ("127.0.0.1", [("x-forwarded-for", "not-an-ip, 10.0.0.6")], "10.0.0.6"),  # garbage: stop at the last good
    ("127.0.0.1", [("x-forwarded-for", "203.0.113.9:4711")], "203.0.113.9"),
    ("127.0.0.1", [("forwarded", "for=203.0.113.9")], "127.0.0.1"),  # not the header the proxy appends to
])
def test_the_client_address_believes_only_listed_proxies(peer: str, headers: list[tuple[str, str]],
                                                         client: str) -> None:
    assert PROXY.client_address(_scope(peer, *headers)) == client


def test_the_forwarded_header_when_the_proxy_appends_to_it() -> None:
    proxies = TrustedProxies.parse("::1", "Forwarded")
    scope = _scope("::1", ("forwarded", 'for=1.1.1.1;proto=http, for="[2001:db8::17]:4711";by=x'),
                   ("x-forwarded-for", "9.9.9.9"))
    assert proxies.client_address(scope) == "2001:db8::17"
    assert TrustedProxies().client_address(_scope("::1", ("x-forwarded-for", "9.9.9.9"))) == "::1"  # none listed


@pytest.mark.parametrize(("text", "header", "problem"), [("10.0.0.0/8, nope", "x-forwarded-for", "'nope'"),
                                                         ("", "x-real-ip", "x-forwarded-for")])
def test_a_bad_proxy_setting_names_what_is_wrong(text: str, header: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        TrustedProxies.parse(text, header)


def test_a_client_is_its_key_when_keys_are_on_else_its_header_or_address() -> None:
    keyed = ClientIdentity(api_keys=BearerKeys(["k-one", "k-two"]), proxies=PROXY, client_id_header="x-user")
    one = _scope("127.0.0.1", ("authorization", "Bearer k-one"), ("x-forwarded-for", "1.1.1.1"))
    assert keyed.client(one) == "key:1" and keyed.client({**one, "client": ("8.8.8.8", 1)}) == "key:1"
    assert keyed.client(_scope("127.0.0.1", ("authorization", "bearer k-two"))) == "key:2"
    assert keyed.key_of(_scope("127.0.0.1", ("authorization", "Bearer k-three"))) is None
    assert keyed.key_of(_scope("127.0.0.1", ("authorization", "Basic k-one"))) is None
    by_header = ClientIdentity(client_id_header="X-User")
    a, b = by_header.client(_scope("1.1.1.1", ("x-user", "alice"))), by_header.client(_scope("2.2.2.2", ("x-user", "alice")))
    assert a == b and a.startswith("header:") and "alice" not in a  # the value is not kept as given
    assert ClientIdentity().client(_scope("192.0.2.1", ("x-forwarded-for", "1.1.1.1"))) == "peer:192.0.2.1"


# --- a real frontend with API keys ----------------------------------------------------------------

KEYS = ["sk-first-0123456789", "sk-second-0123456789"]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontendProcess]:
    """A frontend with two API keys from a file; its worker never comes up (every served request: 503)."""
    key_file = tmp_path_factory.mktemp("keys") / "api-keys"
    key_file.write_text("# one key per line\n" + "\n".join(KEYS) + "\n\n")
    with frontend_process("keyed", "--agg-worker", f"http://127.0.0.1:{free_port_block(1)}", "--api-key-file",
                          str(key_file), health=503) as process:
        yield process


def _client(process: FrontendProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{process.url}/v1", api_key=key, max_retries=0, timeout=30)


@pytest.mark.parametrize("key", ["sk-wrong", KEYS[0] + "x", KEYS[0][:-1]], ids=["wrong", "longer", "shorter"])
def test_a_request_with_a_wrong_key_is_a_401(keyed: FrontendProcess, key: str) -> None:
    with pytest.raises(openai.AuthenticationError) as err:
        _client(keyed, key).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
    assert err.value.response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("path", ["/v1/models", "/v1/chat/completions", "/v1/completions"])
def test_a_request_without_a_key_is_a_401(keyed: FrontendProcess, path: str) -> None:
    r = httpx.request("GET" if path == "/v1/models" else "POST", f"{keyed.url}{path}", timeout=10,
                      **({} if path == "/v1/models" else {"json": {"model": "m", "prompt": "hi"}}))
    assert r.status_code == 401 and "Authorization: Bearer" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("key", KEYS)
def test_a_valid_key_passes(keyed: FrontendProcess, key: str) -> None:
    assert _client(keyed, key).models.list().data == []  # no worker: no model, but authorized
    with pytest.raises(openai.APIStatusError) as err:
        _client(keyed, key).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 503  # past the key check, stopped only by the missing worker


def test_health_and_metrics_need_no_key(keyed: FrontendProcess) -> None:
    assert httpx.get(f"{keyed.url}/health", timeout=10).status_code == 503
    metrics = httpx.get(f"{keyed.url}/metrics", timeout=10)
    assert metrics.status_code == 200 and 'dynlogits_requests_refused_total{reason="unauthorized"}' in metrics.text


def test_a_key_file_without_keys_is_refused_at_start(tmp_path: Path) -> None:
    import subprocess

    from deploy.launcher import PYTHON, ROOT

    empty = tmp_path / "keys"
    empty.write_text("# nothing\n")
    r = subprocess.run([PYTHON, "-m", "dynlogits.serve.frontend", "--agg-worker", "http://127.0.0.1:1", "--api-key-file",
                        str(empty)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "holds no key" in r.stderr
