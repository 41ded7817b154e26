//! What a loop's `web_fetch` may reach on this host: the run's `web.allow-private` (sent in
//! the loop's start), never more than the host's own `--web-allow-private`. A head's
//! allow-list names its own network; on a host the same names and addresses reach the
//! host's (its loopback, its cloud metadata address), so the host's owner decides what of it
//! a loop may reach, as for the sandbox's floor.

use serde_json::Value;
use td_toolkit::web_access::{AllowedHost, WebAccess};

/// The access of a loop on this host: the run's `asked` (`true`, `false`, `null` or a list
/// of host names and IP addresses, as taskdaemon.yml writes it) within this host's
/// `allowed`, and a sentence for each thing of the run's left out. A list entry that is not
/// a host name or an address refuses the loop's start (the head checked it when its config
/// loaded: a head that sends one is not to be guessed at).
pub(super) fn host_web_access(
    asked: &Value,
    allowed: &WebAccess,
) -> Result<(WebAccess, Vec<String>), String> {
    let asked = match asked {
        Value::Null | Value::Bool(false) => WebAccess::PublicOnly,
        Value::Bool(true) => WebAccess::Any,
        Value::Array(entries) => {
            let mut hosts = Vec::with_capacity(entries.len());
            for (i, entry) in entries.iter().enumerate() {
                let text = entry.as_str().ok_or_else(|| {
                    format!("web.allow-private[{i}] of the run is not a host name or an address")
                })?;
                let host = AllowedHost::parse(text)
                    .map_err(|e| format!("web.allow-private[{i}] of the run: {e}"))?;
                hosts.push(host);
            }
            WebAccess::PublicAnd(hosts)
        }
        _ => {
            return Err(
                "the run's web.allow-private is not true, false or a list of hosts".to_string(),
            );
        }
    };
    let mut left_out = Vec::new();
    let access = match (asked, allowed) {
        (WebAccess::PublicOnly, _) => WebAccess::PublicOnly,
        (asked, WebAccess::Any) => asked,
        (WebAccess::Any, WebAccess::PublicOnly) => {
            left_out.push(
                "web.allow-private: true (this host allows no private address: `taskdaemon host --web-allow-private`)"
                    .to_string(),
            );
            WebAccess::PublicOnly
        }
        (WebAccess::Any, WebAccess::PublicAnd(mine)) => {
            left_out.push(format!(
                "web.allow-private: true, beyond this host's {}",
                listed(mine)
            ));
            WebAccess::PublicAnd(mine.clone())
        }
        (WebAccess::PublicAnd(theirs), allowed) => {
            let mine: &[AllowedHost] = match allowed {
                WebAccess::PublicAnd(mine) => mine,
                _ => &[],
            };
            let (kept, dropped): (Vec<AllowedHost>, Vec<AllowedHost>) =
                theirs.into_iter().partition(|h| mine.contains(h));
            if !dropped.is_empty() {
                left_out.push(format!(
                    "web.allow-private {} (not in this host's `--web-allow-private`)",
                    listed(&dropped)
                ));
            }
            if kept.is_empty() {
                WebAccess::PublicOnly
            } else {
                WebAccess::PublicAnd(kept)
            }
        }
    };
    Ok((access, left_out))
}

/// `a, b` of `hosts`, as a user would write them.
fn listed(hosts: &[AllowedHost]) -> String {
    let names: Vec<String> = hosts
        .iter()
        .map(|h| match h {
            AllowedHost::Name(n) => n.clone(),
            AllowedHost::Ip(ip) => ip.to_string(),
        })
        .collect();
    format!("[{}]", names.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hosts(names: &[&str]) -> WebAccess {
        WebAccess::PublicAnd(
            names
                .iter()
                .map(|n| AllowedHost::parse(n).expect("a host"))
                .collect(),
        )
    }

    #[test]
    fn a_loop_gets_the_runs_web_access_only_as_far_as_its_host_allows() {
        let public = WebAccess::PublicOnly;
        // The host's default: public addresses only, whatever the run says.
        for asked in [json!(null), json!(false)] {
            assert_eq!(
                host_web_access(&asked, &public).unwrap(),
                (public.clone(), vec![])
            );
        }
        let (access, left) = host_web_access(&json!(true), &public).unwrap();
        assert_eq!(access, public);
        assert_eq!(left.len(), 1);
        assert!(left[0].contains("--web-allow-private"), "{left:?}");
        let (access, left) = host_web_access(&json!(["127.0.0.1"]), &public).unwrap();
        assert_eq!(access, public);
        assert_eq!(
            left,
            vec!["web.allow-private [127.0.0.1] (not in this host's `--web-allow-private`)"]
        );
        // A host that allows everything gives the run what it asks, no more.
        let any = WebAccess::Any;
        assert_eq!(
            host_web_access(&json!(true), &any).unwrap(),
            (any.clone(), vec![])
        );
        assert_eq!(
            host_web_access(&json!(false), &any).unwrap(),
            (public.clone(), vec![])
        );
        let asked = json!(["localhost", "::1"]);
        assert_eq!(
            host_web_access(&asked, &any).unwrap(),
            (hosts(&["localhost", "::1"]), vec![])
        );
        // A host list keeps the run's entries that are in it (names compared as the config
        // reads them: case does not matter).
        let mine = hosts(&["127.0.0.1", "internal.example"]);
        let (access, left) =
            host_web_access(&json!(["Internal.Example", "10.0.0.1"]), &mine).unwrap();
        assert_eq!(access, hosts(&["internal.example"]));
        assert_eq!(
            left,
            vec!["web.allow-private [10.0.0.1] (not in this host's `--web-allow-private`)"]
        );
        let (access, left) = host_web_access(&json!(true), &mine).unwrap();
        assert_eq!(access, mine);
        assert_eq!(
            left,
            vec!["web.allow-private: true, beyond this host's [127.0.0.1, internal.example]"]
        );
        let (access, _) = host_web_access(&json!(["10.0.0.1"]), &mine).unwrap();
        assert_eq!(access, public);
    }

    #[test]
    fn a_run_web_setting_that_does_not_read_refuses_the_start() {
        let any = WebAccess::Any;
        for bad in [
            json!("yes"),
            json!(1),
            json!({"a": 1}),
            json!([7]),
            json!(["http://x:80/"]),
        ] {
            let e = host_web_access(&bad, &any).unwrap_err();
            assert!(e.contains("web.allow-private"), "{bad}: {e}");
        }
    }
}
