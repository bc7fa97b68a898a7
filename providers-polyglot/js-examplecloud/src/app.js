// An egress-proxies provider for Example Cloud, in JavaScript: the same provider as the Rust
// template (examples/provider-template), built into a component by componentize-js.
//
// The contract's rules, as this provider meets them:
// - the instance name comes from the Proxy UID, so a repeated create finds the instance by name
//   (409) and adopts it only when its uid label is the request's uid;
// - every instance carries the managed, uid and installation labels, and `listByTag` returns
//   only this installation's managed instances;
// - `get` of a missing instance is not-found, `delete` of one succeeds (idempotent);
// - cloud-init goes into the request body only: never into a log line or an error.
//
// componentize-js takes each exported interface from the export of its name (`provider`,
// `listing`), functions in camelCase. A function that answers a `result` returns its value or
// throws the error value; an import that answers one throws an error whose `payload` is its
// error value.

import { send as httpSend } from "egress:provider/http@0.1.3";
import { log } from "egress:provider/log@0.1.3";

const TYPE_NAME = "examplecloud";

// The labels every instance carries: the contract's marks (guest_sdk's LABEL_* constants).
const LABEL_MANAGED = "egress-proxies.crawl.example.com/managed";
const LABEL_UID = "egress-proxies.crawl.example.com/uid";
const LABEL_INSTALLATION = "egress-proxies.crawl.example.com/installation";

// ---------------------------------------------------------------------------------------------
// The config block: where the API is and what to create. Unknown keys are rejected and every
// error names its field path, e.g. `providers[0].config.project: is required`.

const DEFAULT_ENDPOINT = "https://api.examplecloud.test/v1";
// Field name -> default (undefined: required).
const FIELDS = { project: undefined, endpoint: DEFAULT_ENDPOINT, size: "small" };
const PROJECT = /^[a-z0-9-]+$/;

function providerError(cls, reason, message) {
  return { class: cls, message, reason };
}

function configError(at, message) {
  // Permanent: the reconciler waits for the config to change.
  return providerError("permanent", "InvalidConfig", `${at}: ${message}`);
}

function validate(path, text) {
  let block;
  try {
    block = text.trim() ? JSON.parse(text) : {};
  } catch (e) {
    throw configError(path, `not JSON: ${e.message}`);
  }
  if (block === null || typeof block !== "object" || Array.isArray(block)) {
    throw configError(path, "must be a mapping");
  }
  for (const key of Object.keys(block)) {
    if (!(key in FIELDS)) {
      const expected = Object.keys(FIELDS)
        .map((k) => `\`${k}\``)
        .join(", ");
      throw configError(`${path}.${key}`, `unknown field \`${key}\`, expected one of ${expected}`);
    }
  }
  const cfg = {};
  for (const [key, fallback] of Object.entries(FIELDS)) {
    const value = key in block && block[key] !== null ? block[key] : (fallback ?? "");
    if (typeof value !== "string") {
      throw configError(`${path}.${key}`, "must be a string");
    }
    cfg[key] = value;
  }
  if (!cfg.project) {
    throw configError(`${path}.project`, "is required");
  }
  if (!PROJECT.test(cfg.project)) {
    throw configError(`${path}.project`, "must be lowercase letters, digits and dashes");
  }
  if (!cfg.endpoint.startsWith("https://")) {
    throw configError(`${path}.endpoint`, "must be an https:// URL");
  }
  return cfg;
}

// The normalized block the host hands back on every call (validate's own output).
function fromContext(config) {
  try {
    const cfg = JSON.parse(config);
    const out = {};
    for (const [key, fallback] of Object.entries(FIELDS)) {
      out[key] = String(cfg[key] ?? fallback ?? "");
    }
    return out;
  } catch (e) {
    throw providerError("permanent", "InvalidConfig", `normalized config: ${e.message}`);
  }
}

function root(cfg) {
  return cfg.endpoint.replace(/\/+$/, "");
}

function instancesUrl(cfg) {
  return `${root(cfg)}/projects/${cfg.project}/instances`;
}

// ---------------------------------------------------------------------------------------------
// Example Cloud's REST API: the requests, and how each answer maps onto the contract.
//
//     POST   /projects/<p>/instances               {name, size, port, labels, userData}
//     GET    /projects/<p>/instances/<name>
//     DELETE /projects/<p>/instances/<name>
//     GET    /projects/<p>/instances?label=<k>%3D<v>&label=...
//     GET    /projects/<p>/health

const STATES = {
  running: "running",
  stopped: "stopped",
  terminated: "terminated",
  deleting: "terminated",
};

// Sends a request with a JSON body, if any. The URL names its resource; the body never appears
// in an error (it carries cloud-init).
function send(method, url, body) {
  const headers = [["accept", "application/json"]];
  let bytes;
  if (body !== undefined) {
    headers.push(["content-type", "application/json"]);
    bytes = new TextEncoder().encode(JSON.stringify(body));
  }
  try {
    return httpSend({ method, url, headers, body: bytes, credential: undefined });
  } catch (e) {
    throw transportError(method, url, e.payload ?? { tag: "transport", val: String(e) });
  }
}

function transportError(method, url, e) {
  switch (e.tag) {
    case "denied":
      return providerError("permanent", "Denied", `${method} ${url}: ${e.val}`);
    case "credential":
      return providerError("permanent", "Credential", `${method} ${url}: ${e.val}`);
    case "timeout":
      return providerError("transient", "Timeout", `${method} ${url} timed out`);
    case "too-large":
      return providerError("transient", "TooLarge", `${method} ${url}: answer larger than ${e.val} bytes`);
    default:
      return providerError("transient", "Transport", `${method} ${url}: ${e.val}`);
  }
}

function text(r) {
  return new TextDecoder().decode(r.body);
}

// The API's error answer as a classified error: 404 not-found, 429 quota, 5xx transient,
// anything else permanent (the request itself is wrong).
function statusError(method, url, r) {
  let detail = "";
  try {
    detail = JSON.parse(text(r)).error.message ?? "";
  } catch {
    detail = "";
  }
  const message = `${method} ${url}: HTTP ${r.status} ${detail}`.trimEnd();
  if (r.status === 404) return providerError("not-found", "NotFound", message);
  if (r.status === 429) return providerError("quota-exceeded", "RateLimited", message);
  if (r.status >= 500 && r.status <= 599) return providerError("transient", `HTTP${r.status}`, message);
  if (r.status === 401 || r.status === 403) return providerError("permanent", "Unauthorized", message);
  return providerError("permanent", `HTTP${r.status}`, message);
}

function isSuccess(r) {
  return r.status >= 200 && r.status < 300;
}

function answerJson(method, url, r) {
  try {
    return JSON.parse(text(r));
  } catch (e) {
    throw providerError("transient", "BadAnswer", `${method} ${url}: not JSON: ${e.message}`);
  }
}

// An instance answer as the contract's instance.
function fromJson(v) {
  const labels = v.labels ?? {};
  const state = STATES[v.status] ?? "provisioning";
  const name = String(v.name ?? "");
  return {
    providerId: name,
    name,
    uid: String(labels[LABEL_UID] ?? ""),
    installation: String(labels[LABEL_INSTALLATION] ?? ""),
    state,
    // Only a running instance serves; an address on a stopped one is stale.
    ip: state === "running" && typeof v.ip === "string" ? v.ip : undefined,
    createdAt: String(v.createdAt ?? ""),
  };
}

// ---------------------------------------------------------------------------------------------
// The exports.

function get(ctx, providerId) {
  const url = `${instancesUrl(fromContext(ctx.config))}/${providerId}`;
  const r = send("GET", url);
  if (!isSuccess(r)) throw statusError("GET", url, r);
  return fromJson(answerJson("GET", url, r));
}

function listByTag(ctx, installation) {
  const q = (s) => encodeURIComponent(s);
  const url =
    `${instancesUrl(fromContext(ctx.config))}` +
    `?label=${q(`${LABEL_MANAGED}=true`)}&label=${q(`${LABEL_INSTALLATION}=${installation}`)}`;
  const r = send("GET", url);
  if (!isSuccess(r)) throw statusError("GET", url, r);
  const items = answerJson("GET", url, r).items ?? [];
  // The filter is checked again here: a server that ignores it must not make another
  // installation's instances ours.
  return items
    .filter((i) => i !== null && typeof i === "object" && (i.labels ?? {})[LABEL_MANAGED] === "true")
    .map(fromJson)
    .filter((i) => i.installation === installation && i.uid);
}

export const provider = {
  validateConfig(typeName, path, config) {
    return JSON.stringify(validate(path, config));
  },

  describe() {
    return {
      typeName: TYPE_NAME,
      aliases: [],
      profile: {
        readiness: "poll",
        createReturn: "accepted",
        deleteReturn: "accepted",
        ipSource: "api",
        gcMark: "labels",
        createdAt: "api",
        listPartial: "none",
        quota: "429",
        notFound: "404",
        primaryKey: "name-is-key",
      },
      capabilities: ["log", "clock", "http"],
    };
  },

  create(ctx, req) {
    const cfg = fromContext(ctx.config);
    const url = instancesUrl(cfg);
    const body = {
      name: req.name,
      size: cfg.size,
      port: req.port,
      labels: {
        [LABEL_MANAGED]: "true",
        [LABEL_UID]: req.uid,
        [LABEL_INSTALLATION]: req.installation,
      },
      userData: req.cloudInit ?? "",
    };
    log("info", "creating instance", [["name", req.name]]);
    const r = send("POST", url, body);
    if (isSuccess(r)) return fromJson(answerJson("POST", url, r));
    if (r.status !== 409) throw statusError("POST", url, r);
    // The name exists: ours from an earlier attempt, or someone else's.
    let existing;
    try {
      existing = get(ctx, req.name);
    } catch (e) {
      if (e.class === "not-found") {
        throw providerError("transient", "Conflict", `instance ${req.name} existed and then did not; retrying`);
      }
      throw e;
    }
    if (existing.uid !== req.uid) {
      throw providerError(
        "permanent",
        "AlreadyOwned",
        `instance ${req.name} exists and belongs to uid ${JSON.stringify(existing.uid)}`,
      );
    }
    log("info", "adopted instance", [["name", req.name]]);
    return existing;
  },

  get,

  delete(ctx, providerId) {
    const url = `${instancesUrl(fromContext(ctx.config))}/${providerId}`;
    const r = send("DELETE", url);
    // Already gone is what delete wants.
    if (isSuccess(r) || r.status === 404) return;
    throw statusError("DELETE", url, r);
  },

  listByTag,

  check(ctx) {
    const target = (reason, message, address) => ({
      target: ctx.provider,
      address,
      reason,
      message,
      details: [],
    });
    let cfg;
    try {
      cfg = fromContext(ctx.config);
    } catch (e) {
      return [target("InvalidConfig", e.message, "")];
    }
    const url = `${root(cfg)}/projects/${cfg.project}/health`;
    let r;
    try {
      r = send("GET", url);
    } catch (e) {
      return [target("Unreachable", e.message, cfg.endpoint)];
    }
    if (isSuccess(r)) return [target("Healthy", "", cfg.endpoint)];
    const reason = r.status === 401 || r.status === 403 ? "Unauthorized" : "Unhealthy";
    return [target(reason, `HTTP ${r.status}`, cfg.endpoint)];
  },
};

export const listing = {
  // One page of `listByTag`: the API has no page token, so each page lists everything and
  // answers the `limit` instances after the cursor in provider-id order (the cursor is the last
  // provider-id answered), as the Rust SDK's default `list_page` does. Right for any backend,
  // cheap only for one that lists a few instances.
  listPage(ctx, installation, cursor, limit) {
    const everything = listByTag(ctx, installation).sort((a, b) =>
      a.providerId < b.providerId ? -1 : a.providerId > b.providerId ? 1 : 0,
    );
    const after = everything.filter((i) => cursor == null || i.providerId > cursor);
    const page = after.slice(0, Math.max(limit, 1));
    const more = after.length > page.length;
    return [page, more && page.length ? page[page.length - 1].providerId : undefined];
  },
};
