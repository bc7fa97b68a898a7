#![allow(clippy::unwrap_used)]

use super::filter::pinned_last_segment;
use super::*;

const P: &str = "https://compute.googleapis.com/compute/v1/projects/acme-proxies";
const T0: u64 = 1_767_225_600_000;

/// Percent-encodes everything but unreserved characters, as a client's query builder does.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn call(s: &mut Compute, now: u64, method: &str, path: &str, body: Option<Value>) -> Answer {
    let body = body.map(|b| b.to_string().into_bytes());
    s.answer(method, &format!("{P}/{path}"), body.as_deref(), now)
}

fn insert_body(name: &str) -> Value {
    json!({"name": name, "machineType": "zones/europe-west1-b/machineTypes/e2-small",
        "labels": {"egress-proxies-managed": "true"},
        "disks": [{"boot": true, "initializeParams": {"sourceImage": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"}}],
        "networkInterfaces": [{"network": "global/networks/default", "accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}]})
}

const INSTANCES: &str = "zones/europe-west1-b/instances";

#[test]
fn an_instance_boots_over_simulated_time() {
    let mut s = Compute::new(ComputeConfig::default());
    let op = call(&mut s, T0, "POST", INSTANCES, Some(insert_body("p1")));
    assert_eq!(
        (op.status, op.body["status"].as_str()),
        (200, Some("RUNNING"))
    );
    let get = |s: &mut Compute, at: u64| call(s, at, "GET", &format!("{INSTANCES}/p1"), None);
    let i = get(&mut s, T0).body;
    assert_eq!(i["status"], "PROVISIONING");
    assert!(i["networkInterfaces"][0]["accessConfigs"][0]["natIP"].is_null());
    assert_eq!(get(&mut s, T0 + 10_000).body["status"], "STAGING");
    let i = get(&mut s, T0 + 20_000).body;
    assert_eq!(i["status"], "RUNNING");
    assert!(i["networkInterfaces"][0]["accessConfigs"][0]["natIP"].is_string());
    let again = call(
        &mut s,
        T0 + 20_000,
        "POST",
        INSTANCES,
        Some(insert_body("p1")),
    );
    assert_eq!(again.status, 409);
    let d = call(
        &mut s,
        T0 + 20_000,
        "DELETE",
        &format!("{INSTANCES}/p1"),
        None,
    );
    assert_eq!(d.body["operationType"], "delete");
    assert_eq!(get(&mut s, T0 + 20_000).body["status"], "STOPPING");
    // Deleting again is the same deletion, not a later one.
    call(
        &mut s,
        T0 + 22_000,
        "DELETE",
        &format!("{INSTANCES}/p1"),
        None,
    );
    let gone = get(&mut s, T0 + 25_000);
    assert_eq!(
        (
            gone.status,
            gone.body["error"]["errors"][0]["reason"].as_str()
        ),
        (404, Some("notFound"))
    );
    // The name is free again.
    let op = call(
        &mut s,
        T0 + 25_000,
        "POST",
        INSTANCES,
        Some(insert_body("p1")),
    );
    assert_eq!(op.status, 200);
}

#[test]
fn an_exhausted_zone_fails_the_operation_and_the_instance_never_appears() {
    let mut s = Compute::new(ComputeConfig {
        insert_failures: vec![InsertFailure {
            zone: "europe-west1-b".into(),
            code: "ZONE_RESOURCE_POOL_EXHAUSTED".into(),
            message: String::new(),
            until_secs: Some(T0 / 1000 + 60),
        }],
        ..Default::default()
    });
    call(&mut s, T0, "POST", INSTANCES, Some(insert_body("p1")));
    let later = T0 + 3000;
    assert_eq!(
        call(&mut s, later, "GET", &format!("{INSTANCES}/p1"), None).status,
        404
    );
    let ops = |s: &mut Compute, filter: &str| {
        call(
            s,
            later,
            "GET",
            &format!("zones/europe-west1-b/operations?filter={}", enc(filter)),
            None,
        )
        .body
    };
    let filter =
        "(targetLink eq '.*/zones/europe-west1-b/instances/p1') (operationType eq 'insert')";
    let op = &ops(&mut s, filter)["items"][0];
    assert_eq!(op["status"], "DONE");
    assert_eq!(op["httpErrorStatusCode"], 503);
    assert_eq!(
        op["error"]["errors"][0]["code"],
        "ZONE_RESOURCE_POOL_EXHAUSTED"
    );
    let name = op["name"].as_str().unwrap().to_string();
    let by_name = call(
        &mut s,
        later,
        "GET",
        &format!("zones/europe-west1-b/operations/{name}"),
        None,
    );
    assert_eq!(by_name.body["name"], name.as_str());
    assert_eq!(
        call(
            &mut s,
            later,
            "GET",
            &format!("zones/europe-west1-c/operations/{name}"),
            None
        )
        .status,
        404
    );
    let other = "(targetLink eq '.*/instances/p2') (operationType eq 'insert')";
    assert_eq!(ops(&mut s, other)["items"], json!([]));
    // Unfiltered, every operation of the zone.
    assert_eq!(ops(&mut s, "")["items"].as_array().unwrap().len(), 1);
    // Past `until`, inserts succeed again.
    let ok = call(
        &mut s,
        T0 + 61_000,
        "POST",
        INSTANCES,
        Some(insert_body("p1")),
    );
    assert_eq!(ok.status, 200);
    assert_eq!(
        call(&mut s, T0 + 61_000, "GET", &format!("{INSTANCES}/p1"), None).status,
        200
    );
}

#[test]
fn aggregated_list_filters_pages_and_reports_unreachable_zones() {
    let mut s = Compute::new(ComputeConfig {
        unreachable_zones: vec!["asia-east1-a".into()],
        ..Default::default()
    });
    for n in ["a1", "a2", "a3"] {
        call(&mut s, T0, "POST", INSTANCES, Some(insert_body(n)));
    }
    let mut b = insert_body("other");
    b["labels"] = json!({});
    call(&mut s, T0, "POST", INSTANCES, Some(b));
    let f = enc("labels.egress-proxies-managed = \"true\"");
    let list = |s: &mut Compute, q: &str| {
        call(
            s,
            T0,
            "GET",
            &format!("aggregated/instances?filter={f}{q}"),
            None,
        )
    };
    assert_eq!(list(&mut s, "").status, 503);
    let page = list(&mut s, "&maxResults=2&returnPartialSuccess=true").body;
    let here = |v: &Value| {
        v["items"]["zones/europe-west1-b"]["instances"]
            .as_array()
            .map_or(0, Vec::len)
    };
    assert_eq!(here(&page), 2);
    assert_eq!(
        page["items"]["zones/asia-east1-a"]["warning"]["code"],
        "UNREACHABLE"
    );
    assert_eq!(page["unreachables"], json!(["zones/asia-east1-a"]));
    let token = page["nextPageToken"].as_str().unwrap().to_string();
    let next = list(
        &mut s,
        &format!("&maxResults=2&returnPartialSuccess=true&pageToken={token}"),
    )
    .body;
    assert_eq!(here(&next), 1);
    assert!(next.get("nextPageToken").is_none());
}

#[test]
fn seeded_instances_faults_firewalls_and_quotas() {
    let mut s = Compute::new(ComputeConfig {
        regions: vec![Region {
            name: "europe-west1".into(),
            quotas: vec![Quota {
                metric: "CPUS".into(),
                limit: 24.0,
                usage: 4.0,
            }],
        }],
        ..Default::default()
    });
    s.add_instance(SeedInstance {
        zone: "europe-west1-b".into(),
        name: "seed".into(),
        status: "RUNNING".into(),
        nat_ip: Some("34.1.2.3".into()),
        network_ip: None,
        labels: BTreeMap::new(),
        created_ms: T0 - 3_600_000,
    });
    let i = call(&mut s, T0, "GET", &format!("{INSTANCES}/seed"), None).body;
    assert_eq!(i["id"], "900000000000000");
    assert_eq!(i["creationTimestamp"], "2025-12-31T23:00:00.000-00:00");
    let nic = &i["networkInterfaces"][0];
    assert_eq!(nic["networkIP"], "10.128.0.200");
    assert_eq!(nic["accessConfigs"][0]["natIP"], "34.1.2.3");
    let r = call(&mut s, T0, "GET", "regions/europe-west1", None).body;
    assert_eq!(r["quotas"][0]["usage"], 6.0);
    s.add_fault(Fault {
        method: "get".into(),
        url_contains: "/regions/".into(),
        times: 1,
        status: 429,
        reason: "rateLimitExceeded".into(),
        message: String::new(),
    });
    let refused = call(&mut s, T0, "GET", "regions/europe-west1", None);
    assert_eq!(refused.status, 429);
    assert_eq!(refused.body["error"]["message"], "rateLimitExceeded");
    assert_eq!(
        call(&mut s, T0, "GET", "regions/europe-west1", None).status,
        200
    );
    s.insert_firewall(
        "fw",
        json!({"name": "fw", "id": "7", "sourceRanges": ["a"]}),
    );
    let patched = call(
        &mut s,
        T0,
        "PATCH",
        "global/firewalls/fw",
        Some(json!({"sourceRanges": ["b"]})),
    );
    assert_eq!(patched.body["targetId"], "7");
    assert_eq!(s.firewall("fw").unwrap()["sourceRanges"], json!(["b"]));
    assert_eq!(
        call(&mut s, T0, "GET", "global/firewalls/none", None).status,
        404
    );
    assert_eq!(
        call(&mut s, T0, "PUT", "global/firewalls/fw", None).status,
        404
    );
}

#[test]
fn queries_decode_like_form_urlencoding() {
    let q = parse_query("filter=a%20%3D%20%22b%22&x=1+2&bare&&bad=%zz%4");
    assert_eq!(q["filter"], "a = \"b\"");
    assert_eq!(q["x"], "1 2");
    assert_eq!(q["bare"], "");
    assert_eq!(q["bad"], "%zz%4");
}

#[test]
fn a_pinned_target_narrows_the_candidates_only_where_it_must_hold() {
    let f = "(targetLink eq '.*/zones/z/instances/p1') (operationType eq 'insert')";
    assert_eq!(pinned_last_segment(f, "targetLink").as_deref(), Some("p1"));
    assert_eq!(
        pinned_last_segment("targetLink = \"https://x/instances/p2\"", "targetLink").as_deref(),
        Some("p2")
    );
    // A wildcard after the last slash, or none at all, pins nothing.
    assert_eq!(
        pinned_last_segment("targetLink eq '.*/p.*'", "targetLink"),
        None
    );
    assert_eq!(
        pinned_last_segment("targetLink eq '.*p1'", "targetLink"),
        None
    );
    assert_eq!(
        pinned_last_segment("targetLink ne '.*/p1'", "targetLink"),
        None
    );
    assert_eq!(pinned_last_segment("name eq 'x/y'", "targetLink"), None);
}

#[test]
fn wildcard_matches_whole_strings() {
    assert!(wildcard(
        ".*/instances/p1",
        "https://x/zones/z/instances/p1"
    ));
    assert!(!wildcard(
        ".*/instances/p1",
        "https://x/zones/z/instances/p10"
    ));
    assert!(wildcard("insert", "insert"));
    assert!(wildcard("a.*b.*c", "aXXbYYc"));
}

/// The bytes a client reads are the JSON of the answer, through every state an instance
/// passes (provisioning, staging, running with its address, stopping, gone, a name used
/// again), whether its JSON was written for an earlier read or not; refusals and other
/// requests alike.
#[test]
fn answer_bytes_are_the_answers_json_in_every_state() {
    let mut by_value = Compute::new(ComputeConfig::default());
    let mut by_bytes = by_value.clone();
    let both = |a: &mut Compute,
                b: &mut Compute,
                at: u64,
                method: &str,
                path: &str,
                body: Option<Value>| {
        let url = format!("{P}/{path}");
        let body = body.map(|b| b.to_string().into_bytes());
        let answer = a.answer(method, &url, body.as_deref(), at);
        let (status, bytes) = b.answer_bytes(method, &url, body.as_deref(), at);
        assert_eq!(status, answer.status, "{method} {path} at {at}");
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            answer.body.to_string(),
            "{method} {path} at {at}"
        );
    };
    let p1 = format!("{INSTANCES}/p1");
    both(
        &mut by_value,
        &mut by_bytes,
        T0,
        "POST",
        INSTANCES,
        Some(insert_body("p1")),
    );
    for at in [0, 1_000, 10_000, 10_000, 20_000, 20_000, 60_000] {
        both(&mut by_value, &mut by_bytes, T0 + at, "GET", &p1, None);
    }
    // Another project reads it with its own links.
    let other = format!("https://compute.googleapis.com/compute/v1/projects/other/{p1}");
    let answer = by_value.answer("GET", &other, None, T0 + 60_000);
    let (_, bytes) = by_bytes.answer_bytes("GET", &other, None, T0 + 60_000);
    assert_eq!(String::from_utf8(bytes).unwrap(), answer.body.to_string());
    both(
        &mut by_value,
        &mut by_bytes,
        T0 + 60_000,
        "DELETE",
        &p1,
        None,
    );
    both(&mut by_value, &mut by_bytes, T0 + 60_000, "GET", &p1, None);
    both(&mut by_value, &mut by_bytes, T0 + 120_000, "GET", &p1, None);
    both(
        &mut by_value,
        &mut by_bytes,
        T0 + 120_000,
        "POST",
        INSTANCES,
        Some(insert_body("p1")),
    );
    both(&mut by_value, &mut by_bytes, T0 + 121_000, "GET", &p1, None);
    both(
        &mut by_value,
        &mut by_bytes,
        T0 + 121_000,
        "GET",
        "zones/europe-west1-b/instances/none",
        None,
    );
    both(
        &mut by_value,
        &mut by_bytes,
        T0 + 121_000,
        "GET",
        "regions/europe-west1",
        None,
    );
}
