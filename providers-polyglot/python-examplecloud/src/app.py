"""An egress-proxies provider for Example Cloud, in Python: the same provider as the Rust
template (examples/provider-template), built into a component by componentize-py.

The contract's rules, as this provider meets them:
- the instance name comes from the Proxy UID, so a repeated create finds the instance by name
  (409) and adopts it only when its uid label is the request's uid;
- every instance carries the managed, uid and installation labels, and `list-by-tag` returns
  only this installation's managed instances;
- `get` of a missing instance is NotFound, `delete` of one succeeds (idempotent);
- cloud-init goes into the request body only: never into a log line or an error.

componentize-py looks for a class named after each exported interface: `Provider` and
`Listing`. A method answers a `result` by returning its value or raising `Err(value)`.
"""

import json

import api
import config
from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import log
from wit_world.imports.types import (
    Capability,
    Description,
    ErrorClass,
    Profile,
    ProviderError,
    TargetStatus,
)

TYPE_NAME = "examplecloud"


class Provider(exports.Provider):
    def validate_config(self, type_name, path, block):
        return json.dumps(config.validate(path, block), separators=(",", ":"))

    def describe(self):
        return Description(
            type_name=TYPE_NAME,
            aliases=[],
            profile=Profile(
                readiness="poll",
                create_return="accepted",
                delete_return="accepted",
                ip_source="api",
                gc_mark="labels",
                created_at="api",
                list_partial="none",
                quota="429",
                not_found="404",
                primary_key="name-is-key",
            ),
            capabilities=[Capability.LOG, Capability.CLOCK, Capability.HTTP],
        )

    def create(self, ctx, req):
        cfg = config.from_context(ctx.config)
        url = config.instances_url(cfg)
        body = {
            "name": req.name,
            "size": cfg["size"],
            "port": req.port,
            "labels": {
                api.LABEL_MANAGED: "true",
                api.LABEL_UID: req.uid,
                api.LABEL_INSTALLATION: req.installation,
            },
            "userData": req.cloud_init or "",
        }
        log.log(log.Level.INFO, "creating instance", [("name", req.name)])
        r = api.send("POST", url, body)
        if api.is_success(r):
            return api.from_json(api.answer_json("POST", url, r))
        if r.status != 409:
            raise api.status_error("POST", url, r)
        # The name exists: ours from an earlier attempt, or someone else's.
        try:
            existing = self.get(ctx, req.name)
        except Err as e:
            if e.value.class_ == ErrorClass.NOT_FOUND:
                raise api.error(
                    ErrorClass.TRANSIENT,
                    "Conflict",
                    f"instance {req.name} existed and then did not; retrying",
                )
            raise
        if existing.uid != req.uid:
            raise api.error(
                ErrorClass.PERMANENT,
                "AlreadyOwned",
                f"instance {req.name} exists and belongs to uid {existing.uid!r}",
            )
        log.log(log.Level.INFO, "adopted instance", [("name", req.name)])
        return existing

    def get(self, ctx, provider_id):
        cfg = config.from_context(ctx.config)
        url = f"{config.instances_url(cfg)}/{provider_id}"
        r = api.send("GET", url)
        if not api.is_success(r):
            raise api.status_error("GET", url, r)
        return api.from_json(api.answer_json("GET", url, r))

    def delete(self, ctx, provider_id):
        cfg = config.from_context(ctx.config)
        url = f"{config.instances_url(cfg)}/{provider_id}"
        r = api.send("DELETE", url)
        # Already gone is what delete wants.
        if api.is_success(r) or r.status == 404:
            return None
        raise api.status_error("DELETE", url, r)

    def list_by_tag(self, ctx, installation):
        cfg = config.from_context(ctx.config)
        url = (
            f"{config.instances_url(cfg)}"
            f"?label={api.query_value(api.LABEL_MANAGED + '=true')}"
            f"&label={api.query_value(api.LABEL_INSTALLATION + '=' + installation)}"
        )
        r = api.send("GET", url)
        if not api.is_success(r):
            raise api.status_error("GET", url, r)
        items = api.answer_json("GET", url, r).get("items") or []
        # The filter is checked again here: a server that ignores it must not make another
        # installation's instances ours.
        listed = (
            api.from_json(i)
            for i in items
            if isinstance(i, dict) and (i.get("labels") or {}).get(api.LABEL_MANAGED) == "true"
        )
        return [i for i in listed if i.installation == installation and i.uid]

    def check(self, ctx):
        def target(reason, message, address):
            return TargetStatus(ctx.provider, address, reason, message, [])

        try:
            cfg = config.from_context(ctx.config)
        except Err as e:
            return [target("InvalidConfig", e.value.message, "")]
        url = f"{cfg['endpoint'].rstrip('/')}/projects/{cfg['project']}/health"
        try:
            r = api.send("GET", url)
        except Err as e:
            return [target("Unreachable", e.value.message, cfg["endpoint"])]
        if api.is_success(r):
            return [target("Healthy", "", cfg["endpoint"])]
        reason = "Unauthorized" if r.status in (401, 403) else "Unhealthy"
        return [target(reason, f"HTTP {r.status}", cfg["endpoint"])]


class Listing(exports.Listing):
    def list_page(self, ctx, installation, cursor, limit):
        """One page of `list_by_tag`: the API has no page token, so each page lists everything
        and answers the `limit` instances after the cursor in provider-id order (the cursor is
        the last provider-id answered), as the Rust SDK's default `list_page` does. Right for
        any backend, cheap only for one that lists a few instances."""
        everything = sorted(Provider().list_by_tag(ctx, installation), key=lambda i: i.provider_id)
        after = [i for i in everything if cursor is None or i.provider_id > cursor]
        page = after[: max(limit, 1)]
        more = len(after) > len(page)
        return (page, page[-1].provider_id if more and page else None)
