"""Backfill per scraper (the gateway's side): the proxy names each request's scraper to the
agent and a client cannot forge it; the scraper book is bounded and forgets; each scrape goes
to its replica's receiver (per_scraper) or, of an HA pair's two copies, one goes to the shared
receiver; an agent cannot point the gateway's writes at an address that never scraped."""

from __future__ import annotations

import pytest

from cloud_gateway.backfill.routing import PER_SCRAPER, SHARED, receiver_url, route
from cloud_gateway.backfill.scrapers import ScraperBook
from cloud_gateway.proxy.heads import parse_request_head
from cloud_gateway.proxy.rewrite import request_head_for_target
from cloud_gateway.proxy.target import Mode, Target
from raven.backfill.wire import Scrape
from raven.config.backfill import BackfillJob, GatewayBackfillConfig, job_for

PROM_0, PROM_1, OTHER = "10.42.0.7", "10.42.1.9", "10.9.9.9"
TEMPLATE = "http://{scraper}:9090/api/v1/write"
SAMPLES = (("up", (), 1.0, None), ("x", (), 2.0, None))


def scrape(address: str, node: str = "edge-gpu-1", ts: int = 1000, mode: str = "forward") -> Scrape:
    """A backfilled scrape the agent names ``<address>/<mode>`` (as the gateway named it)."""
    return Scrape(node, 9400, "/metrics", ts, SAMPLES, f"{address}/{mode}" if address else "")


def book(now: list[float], ttl_s: float = 100.0) -> ScraperBook:
    return ScraperBook(ttl_s=ttl_s, max_entries=8, clock=lambda: now[0])


def test_the_proxy_names_the_scraper_and_drops_a_forged_name() -> None:
    forged = b"X-Raven-Scraper: 10.0.0.1\r\n"
    req = parse_request_head(
        b"GET /metrics HTTP/1.1\r\nHost: edge-gpu-1:9400\r\n" + forged + b"\r\n"
    )
    target = Target(Mode.DNS, "edge-gpu-1", 9400, "/metrics")
    head = request_head_for_target(req, target, scraper=PROM_0)
    assert head.count(b"X-Raven-Scraper") == 1 and b"X-Raven-Scraper: 10.42.0.7\r\n" in head
    assert b"10.0.0.1" not in request_head_for_target(req, target)  # backfill off: none


def test_the_book_is_bounded_forgets_and_picks_a_primary() -> None:
    now = [0.0]
    scrapers = book(now)
    assert scrapers.note(PROM_1, "forward") == f"{PROM_1}/forward"
    scrapers.note(PROM_0, "forward")
    scrapers.note_backfill(PROM_1, "edge-gpu-1", 9400)
    scrapers.note_backfill(PROM_0, "edge-gpu-1", 9400)
    assert scrapers.primary("edge-gpu-1", 9400) == PROM_0 and scrapers.known(PROM_1)
    assert not scrapers.settled()
    others = [f"10.9.9.{i}" for i in range(8)]
    for i, other in enumerate(others):  # the oldest entries go past the bound
        scrapers.note(other, "dns")
        scrapers.note_backfill(OTHER, f"edge-gpu-{i + 2}", 9400)
    assert not scrapers.known(PROM_1) and scrapers.primary("edge-gpu-1", 9400) is None
    now[0] = 101.0
    assert not scrapers.known(others[-1]) and scrapers.settled()  # not seen for the TTL: gone


def test_per_scraper_each_replica_gets_its_own() -> None:
    now = [0.0]
    scrapers = book(now)
    scrapers.note(PROM_0, "forward")
    scrapers.note("fd00::7", "dns")
    routes = route([scrape(PROM_0), scrape("fd00::7"), scrape("")], PER_SCRAPER, TEMPLATE, scrapers)
    got = {u: len(s) for u, s in routes.by_url.items()}
    assert got == {"http://10.42.0.7:9090/api/v1/write": 1, "http://[fd00::7]:9090/api/v1/write": 1}
    assert routes.dropped == {"no_scraper": 2} and routes.wait == ""


def test_per_scraper_never_writes_to_an_address_that_did_not_scrape() -> None:
    now = [0.0]
    scrapers = book(now)
    routes = route([scrape("169.254.169.254")], PER_SCRAPER, TEMPLATE, scrapers)
    assert routes.wait == "169.254.169.254" and not routes.by_url  # kept: maybe not seen yet
    now[0] = 101.0  # the gateway has run a TTL: an address it never saw is gone for good
    routes = route([scrape("169.254.169.254")], PER_SCRAPER, TEMPLATE, scrapers)
    assert routes.dropped == {"scraper_gone": 2} and not routes.by_url and routes.wait == ""


def test_shared_one_copy_of_an_ha_pair() -> None:
    now = [0.0]
    scrapers = book(now)
    url = "http://thanos-receive:19291/api/v1/receive"
    scrapers.note("127.0.0.1", "forward")  # a curl: never backfilled
    both = [scrape(PROM_1), scrape(PROM_0), scrape(PROM_1, ts=2000), scrape("", node="edge-gpu-2")]
    routes = route(both, SHARED, url, scrapers)  # the lowest address of those backfilled
    assert [s.scraper for s in routes.by_url[url]] == [f"{PROM_0}/forward", ""]
    assert routes.dropped == {"other_replica": 4}
    routes = route([scrape(PROM_1, ts=3000)], SHARED, url, scrapers)  # stable across batches
    assert not routes.by_url and routes.dropped == {"other_replica": 2}
    now[0] = 101.0  # PROM_0 not backfilled for a TTL (gone): PROM_1's copy is written
    routes = route([scrape(PROM_1, ts=4000)], SHARED, url, scrapers)
    assert [s.scraper for s in routes.by_url[url]] == [f"{PROM_1}/forward"]


def test_shared_keeps_every_job_of_the_primary() -> None:
    """Two jobs of one Prometheus (a dns job and a proxy_url job) are two scrapers of one
    address: both are the primary's, both written, each with its own job's labels later."""
    now = [0.0]
    batch = [scrape(PROM_0, mode="dns"), scrape(PROM_0, mode="forward"), scrape(PROM_1)]
    routes = route(batch, SHARED, "http://rx/api/v1/write", book(now))
    written = [s.scraper for s in routes.by_url["http://rx/api/v1/write"]]
    assert written == [f"{PROM_0}/dns", f"{PROM_0}/forward"]


def test_two_jobs_on_one_port_told_apart_by_mode_or_path() -> None:
    dns = BackfillJob(port=9400, job="edge-dns", mode="dns")
    sd = BackfillJob(port=9400, job="edge-sd", mode="forward", discovery_labels=True)
    gpu = BackfillJob(port=9400, job="edge-gpu-only", path="/metrics?collect[]=gpu")
    jobs = [dns, sd, gpu]
    assert job_for(jobs, 9400, "dns", "/metrics") is dns
    assert job_for(jobs, 9400, "forward", "/metrics") is sd
    assert job_for(jobs, 9400, "forward", "/metrics?collect[]=gpu") is gpu  # the path wins
    assert job_for(jobs, 9400, "path", "/metrics") is None
    assert job_for([BackfillJob(port=9400, job="any")], 9400, "", "/x") is not None
    GatewayBackfillConfig(jobs=jobs)  # several jobs on one port: accepted
    with pytest.raises(ValueError, match="same port, mode and path"):
        GatewayBackfillConfig(jobs=[dns, BackfillJob(port=9400, job="again", mode="dns")])
    with pytest.raises(ValueError, match="mode 'proxy'"):
        BackfillJob(port=9400, job="x", mode="proxy")


def test_receiver_url_and_config() -> None:
    assert receiver_url(TEMPLATE, PROM_0) == "http://10.42.0.7:9090/api/v1/write"
    GatewayBackfillConfig(receivers="per_scraper", remote_write_url=TEMPLATE)
    for bad in ({"receivers": "per_scraper"}, {"remote_write_url": TEMPLATE},
                {"receivers": "each"}):  # fmt: skip
        with pytest.raises(ValueError, match="receivers"):
            GatewayBackfillConfig(**bad)  # type: ignore[arg-type]
