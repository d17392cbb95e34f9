"""``inferd envoy-config --route-by-model``: each model's traffic to the same node, by hashing.

With lazy serving (``--model-memory-budget``) a node holds the models it is asked for; spread
round robin, every model ends up loaded on every node. Routed by model, Envoy hashes each
request's model name onto a consistent-hash ring of the nodes (``ring_hash``, or ``maglev``),
so a model is loaded on one node, and moves only when that node leaves (or is retried away
from). Envoy does the routing; inferd only writes its configuration:

- HTTP: the model name is read from the path (``/v2/models/NAME/...``, TF Serving's
  ``/v1/models/NAME[/versions/N]:verb``), so every client is routed with nothing to add;
- gRPC: the model is in the message, which Envoy does not read, so a client names it in the
  metadata header ``inferd-model`` (``MODEL_HEADER``); a call without it is balanced round
  robin, as are requests that name no model (health, index, repository calls).

The model routes go to a second cluster of the same nodes with the hashing balancer; the rest
keep the round-robin cluster. This module only transforms what ``envoy_config`` built.
"""

from __future__ import annotations

import copy
from typing import Any

MODEL_HEADER = "inferd-model"
HASH_LBS = ("ring_hash", "maglev")
SUFFIX = "_by_model"
# Paths that name a model: KServe v2 and TF Serving REST; the first group is the model's name.
MODEL_NAME = r"^/v[12]/models/([^/:?]+).*$"
MODEL_READS = r"/v[12]/models/[^?]+"
GENERATE = r"/v2/models/[^?]+/generate(_stream)?"


def hashed_cluster(cluster: dict[str, Any], lb: str) -> dict[str, Any]:
    """A copy of ``cluster`` (the same nodes and health checks) balanced by a hash ring."""
    if lb not in HASH_LBS:
        raise ValueError(f"--hash-lb must be one of {', '.join(HASH_LBS)}, not '{lb}'")
    found = copy.deepcopy(cluster)
    found["name"] = cluster["name"] + SUFFIX
    found["load_assignment"]["cluster_name"] = found["name"]
    found["lb_policy"] = lb.upper()
    if lb == "ring_hash":
        found["ring_hash_lb_config"] = {"minimum_ring_size": 1024}
    if found["type"] == "STATIC":
        # Each node hashes by its host, not host:port, so the HTTP and gRPC rings agree and a
        # model reached over both protocols lands on one node. (Names resolved by DNS give one
        # host name to every address: those are hashed by address, each protocol on its own.)
        for item in found["load_assignment"]["endpoints"][0]["lb_endpoints"]:
            key = {"hash_key": item["endpoint"]["hostname"]}
            item["metadata"] = {"filter_metadata": {"envoy.lb": key}}
    return found


def _hashed(route: dict[str, Any], match: dict[str, Any], policy: dict[str, Any]) -> dict[str, Any]:
    found = copy.deepcopy(route)
    found["match"] = match
    found["route"]["cluster"] += SUFFIX
    found["route"]["hash_policy"] = [policy]
    return found


def http_routes(
    infer: dict[str, Any], reads: dict[str, Any], writes: dict[str, Any]
) -> list[dict[str, Any]]:
    """Routes that hash the model named in the path, to put before ``envoy_config``'s own:
    inference as ``infer`` is routed, the model's metadata and readiness as ``reads``, and
    generate calls as ``writes`` (their timeouts and retries kept)."""
    by_path = {
        "header": {
            "header_name": ":path",
            "regex_rewrite": {"pattern": {"regex": MODEL_NAME}, "substitution": r"\1"},
        }
    }
    model_reads = {"safe_regex": {"regex": MODEL_READS}, "headers": reads["match"]["headers"]}
    generate = {"safe_regex": {"regex": GENERATE}}
    return [
        _hashed(infer, infer["match"], by_path),
        _hashed(reads, model_reads, by_path),
        _hashed(writes, generate, by_path),
    ]


def grpc_routes(routes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each of ``envoy_config``'s gRPC routes, the same route for calls that carry the
    ``inferd-model`` header, hashing its value; calls without it fall through to round robin."""
    by_header = {"header": {"header_name": MODEL_HEADER}}
    present = {"name": MODEL_HEADER, "present_match": True}
    found = []
    for route in routes:
        match = copy.deepcopy(route["match"])
        match.setdefault("headers", []).append(present)
        found.append(_hashed(route, match, by_header))
    return found
