# The Python `kubernetes` client (PyPI, pinned in scripts/test-python.txt) against
# bootplane, driven by tests/it/kube_python.rs: python3 kube_python.py PHASE KUBECONFIG [RV]
#
# phase "crud": CustomObjectsApi create/get/list/patch (merge and JSON)/delete, the errors
#   a real apiserver gives (404, 409, 422), a Watch() stream seeing a create, and
#   DynamicClient discovery; prints a list's resourceVersion older than the current one.
# phase "gone": after bootplane restarted (its watch history is in memory), a watch from
#   RV (older than the history) raises 410; re-listing and watching from the new list's
#   version sees the next change.
import json
import sys
import threading

from kubernetes import client, config, dynamic, watch
from kubernetes.client.rest import ApiException

G, V = "metal.ironcore.dev", "v1alpha1"


def server(name, uuid):
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "Server",
        "metadata": {"name": name, "labels": {"from": "python"}},
        "spec": {"systemUUID": uuid},
    }


def expect_status(code, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except ApiException as e:
        assert e.status == code, f"{fn.__name__}: {e.status} (want {code}): {e.body}"
        return json.loads(e.body) if e.body else {}
    raise AssertionError(f"{fn.__name__} succeeded, want {code}")


def crud(api):
    made = api.create_cluster_custom_object(G, V, "servers", server("py-a", "6c1e3f4a-2b5d-4c7e-8f90-a1b2c3d4e5f6"))
    assert made["metadata"]["name"] == "py-a" and made["metadata"]["uid"], made
    got = api.get_cluster_custom_object(G, V, "servers", "py-a")
    assert got["spec"]["systemUUID"] == "6c1e3f4a-2b5d-4c7e-8f90-a1b2c3d4e5f6", got
    st = expect_status(409, api.create_cluster_custom_object, G, V, "servers", server("py-a", "6c1e3f4a-2b5d-4c7e-8f90-a1b2c3d4e5f7"))
    assert st["reason"] == "AlreadyExists", st
    st = expect_status(404, api.get_cluster_custom_object, G, V, "servers", "py-none")
    assert st["reason"] == "NotFound" and st["kind"] == "Status", st
    bad = server("py-bad", "6c1e3f4a-2b5d-4c7e-8f90-a1b2c3d4e5f8")
    bad["spec"]["colour"] = "red"
    expect_status(422, api.create_cluster_custom_object, G, V, "servers", bad)

    # A merge patch (the client's default for custom objects), then a JSON patch.
    p = api.patch_cluster_custom_object(G, V, "servers", "py-a", {"metadata": {"labels": {"merge": "yes"}}})
    assert p["metadata"]["labels"] == {"from": "python", "merge": "yes"}, p["metadata"]
    ops = [{"op": "add", "path": "/metadata/labels/json", "value": "yes"}]
    p = api.patch_cluster_custom_object(G, V, "servers", "py-a", ops, _content_type="application/json-patch+json")
    assert p["metadata"]["labels"]["json"] == "yes", p["metadata"]

    claim = {"apiVersion": f"{G}/{V}", "kind": "ServerClaim",
             "metadata": {"name": "py-claim", "namespace": "default"},
             "spec": {"power": "Off", "serverSelector": {"matchLabels": {"nobody": "x"}}, "image": "os-image:latest"}}
    api.create_namespaced_custom_object(G, V, "default", "serverclaims", claim)
    claims = api.list_namespaced_custom_object(G, V, "default", "serverclaims")
    assert [c["metadata"]["name"] for c in claims["items"]] == ["py-claim"], claims

    lst = api.list_cluster_custom_object(G, V, "servers", label_selector="from=python")
    assert [i["metadata"]["name"] for i in lst["items"]] == ["py-a"], lst
    rv = lst["metadata"]["resourceVersion"]

    # A watch from that list's version sees a server created meanwhile.
    t = threading.Timer(0.5, lambda: api.create_cluster_custom_object(G, V, "servers", server("py-b", "6c1e3f4a-2b5d-4c7e-8f90-a1b2c3d4e5f9")))
    t.start()
    w = watch.Watch()
    seen = []
    for ev in w.stream(api.list_cluster_custom_object, G, V, "servers", resource_version=rv, timeout_seconds=20):
        seen.append((ev["type"], ev["object"]["metadata"]["name"]))
        if ev["object"]["metadata"]["name"] == "py-b":
            w.stop()
    t.join()
    assert ("ADDED", "py-b") in seen, seen

    # DynamicClient: discovery, then a typed handle on a kind.
    dyn = dynamic.DynamicClient(client.ApiClient())
    servers = dyn.resources.get(api_version=f"{G}/{V}", kind="Server")
    assert servers.namespaced is False and servers.name == "servers"
    claims = dyn.resources.get(api_version=f"{G}/{V}", kind="ServerClaim")
    assert claims.namespaced is True
    secrets = dyn.resources.get(api_version="v1", kind="Secret")
    assert secrets.namespaced is True
    got = servers.get(name="py-a")
    assert got.spec.systemUUID == "6c1e3f4a-2b5d-4c7e-8f90-a1b2c3d4e5f6"
    names = sorted(i.metadata.name for i in servers.get(label_selector="from=python").items)
    assert names == ["py-a", "py-b"], names

    api.delete_cluster_custom_object(G, V, "servers", "py-b")
    expect_status(404, api.get_cluster_custom_object, G, V, "servers", "py-b")
    # The version of the list before py-b came and went: older than the current one, so
    # older than anything a restarted bootplane keeps.
    print(rv)


def gone(api, old_rv):
    w = watch.Watch()
    try:
        for _ in w.stream(api.list_cluster_custom_object, G, V, "servers", resource_version=old_rv, timeout_seconds=10):
            pass
        raise AssertionError("a watch from a version older than the history did not fail")
    except ApiException as e:
        assert e.status == 410, f"{e.status}: {e.body}"
    lst = api.list_cluster_custom_object(G, V, "servers")
    assert "py-a" in [i["metadata"]["name"] for i in lst["items"]], lst
    t = threading.Timer(0.5, lambda: api.patch_cluster_custom_object(G, V, "servers", "py-a", {"metadata": {"labels": {"after": "restart"}}}))
    t.start()
    seen = []
    for ev in w.stream(api.list_cluster_custom_object, G, V, "servers", resource_version=lst["metadata"]["resourceVersion"], timeout_seconds=20):
        seen.append((ev["type"], ev["object"]["metadata"]["name"], ev["object"]["metadata"].get("labels", {}).get("after")))
        if seen[-1] == ("MODIFIED", "py-a", "restart"):
            w.stop()
    t.join()
    assert ("MODIFIED", "py-a", "restart") in seen, seen
    print("ok")


def main():
    phase, kubeconfig = sys.argv[1], sys.argv[2]
    config.load_kube_config(config_file=kubeconfig)
    api = client.CustomObjectsApi()
    if phase == "crud":
        crud(api)
    else:
        gone(api, sys.argv[3])


main()
