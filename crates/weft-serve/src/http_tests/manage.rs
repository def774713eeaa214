//! The management API's queries and names: every call refuses a query parameter it does not
//! take (describe, set-default and unregister took any without a word; describe takes
//! TorchServe's `customized`), `GET /models` pages as
//! TorchServe's does (`limit`, `next_page_token`), and registration names the parameter at fault
//! and refuses the reserved versions `all` and `traffic`.

use serde_json::{json, Value};

use super::{message, request, start};
use crate::Limits;

#[test]
fn every_management_call_refuses_parameters_it_does_not_take() {
    let s = start(Limits::default());
    let manage = |method: &str, path: &str| request(s.management, method, path, "", true);
    for (method, path, want) in [
        (
            "GET",
            "/models/m/1?x=1",
            "unknown query parameter \"x\": GET /models/{name}/{version} takes customized",
        ),
        (
            "GET",
            "/models/m?customized=yes",
            "customized: \"yes\" is not true or false",
        ),
        ("GET", "/models/m/all?x=1", "unknown query parameter \"x\""),
        (
            "DELETE",
            "/models/m/2?foo=1",
            "DELETE /models/{name}/{version} takes no query parameters",
        ),
        (
            "PUT",
            "/models/m/2/set-default?foo=1",
            "PUT /models/{name}/{version}/set-default takes no query parameters",
        ),
        ("GET", "/models?foo=1", "GET /models takes limit, next_page_token"),
        ("GET", "/models?limit=0", "limit: 0 is outside 1 to"),
        ("GET", "/models?limit=x", "limit: \"x\" is not a whole number"),
        ("GET", "/models?limit=1&limit=2", "limit: given twice"),
    ] {
        let (status, answer) = manage(method, path);
        assert_eq!(status, 400, "{method} {path}: {answer}");
        assert!(message(&answer).contains(want), "{method} {path}: {answer}");
    }
    // nothing was changed: version 2 is served, version 1 the default
    let (status, described) = manage("GET", "/models/m/all");
    assert_eq!(status, 200, "{described}");
    let versions: Vec<(&str, bool)> = described
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["modelVersion"].as_str().unwrap(), v["isDefault"].as_bool().unwrap()))
        .collect();
    assert_eq!(versions, [("1", true), ("2", false), ("wide", false)]);
    // TorchServe's `customized`: weft's models have no metadata of their own, the same answer
    for path in ["/models/m/all?customized=true", "/models/m/all?customized=false"] {
        assert_eq!(manage("GET", path), (200, described.clone()), "{path}");
    }
}

#[test]
fn models_are_listed_a_page_at_a_time() {
    let s = start(Limits::default());
    let list = |query: &str| {
        let (status, answer) = request(s.management, "GET", &format!("/models{query}"), "", true);
        assert_eq!(status, 200, "{query}: {answer}");
        answer
    };
    let names = |answer: &Value| -> Vec<String> {
        let models = answer["models"].as_array().cloned().unwrap_or_default();
        models
            .iter()
            .map(|m| m["modelName"].as_str().unwrap().to_string())
            .collect()
    };
    // without a limit: every model, no token
    let all = list("");
    assert_eq!(names(&all), ["g", "m"]);
    assert!(all.get("nextPageToken").is_none(), "{all}");
    // a page of one, then the next from its token; the last page has no token
    let first = list("?limit=1");
    assert_eq!(
        (names(&first), &first["nextPageToken"]),
        (vec!["g".to_string()], &json!("g"))
    );
    let second = list("?limit=1&next_page_token=g");
    assert_eq!(names(&second), ["m"]);
    assert!(second.get("nextPageToken").is_none(), "{second}");
    assert_eq!(names(&list("?limit=2")), ["g", "m"]);
    assert_eq!(names(&list("?next_page_token=m")), Vec::<String>::new());
}

#[test]
fn registration_names_the_parameter_at_fault_and_refuses_reserved_versions() {
    let s = start(Limits::default());
    for (query, want) in [
        (
            "url=gpt&model_name=a%3Db",
            "model_name \"a=b\" must be 1 to 64 of A-Z a-z 0-9 . _ -",
        ),
        (
            "url=gpt&model_name=a&version=x%3Ay",
            "version \"x:y\" must be 1 to 64 of A-Z a-z 0-9 . _ -",
        ),
        (
            "url=gpt&model_name=a&version=all",
            "version \"all\" is reserved: /models/NAME/all names every version",
        ),
        (
            "url=gpt&model_name=a&version=traffic",
            "version \"traffic\" is reserved: PUT /models/NAME/traffic sets",
        ),
        ("url=&model_name=a", "url: empty"),
    ] {
        let (status, answer) = request(s.management, "POST", &format!("/models?{query}"), "", true);
        assert_eq!(status, 400, "{query}: {answer}");
        let m = message(&answer);
        assert!(m.contains(want), "{query}: {m}");
        assert!(!m.contains("url \"gpt\""), "{query}: {m}");
    }
    // each parameter on its own is fine: the checks go on to the folder, which is not there
    let (status, answer) = request(
        s.management,
        "POST",
        "/models?url=nowhere&model_name=a&version=7",
        "",
        true,
    );
    assert_eq!(status, 404, "{answer}");
}
