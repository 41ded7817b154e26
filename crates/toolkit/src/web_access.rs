//! Which network destinations `web_fetch` may reach: the classifier that tells public
//! internet addresses from loopback, private, link-local and reserved ones (also when an
//! IPv6 address embeds such an IPv4 address), the run's allow-list (`web: {allow-private}`
//! in `taskdaemon.yml`), and the DNS resolver and redirect policy that enforce them.
//!
//! A model that reads web pages can be talked into fetching `http://169.254.169.254/` (cloud
//! credentials) or a service on the daemon's own machine. So the decision is made on the
//! address that is connected to, never on the URL's text: a URL naming an IP literal (in any
//! spelling the URL parser accepts — `2130706433`, `0x7f.1`, `127.1` all become 127.0.0.1)
//! is checked before the request and at every redirect hop, and a host name is checked on
//! what it resolves to, inside the resolver the HTTP client connects with, so the addresses
//! checked are the addresses used (a name that re-resolves elsewhere later gains nothing).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::{Ipv4Net, Ipv6Net};
use reqwest::Url;

/// What `web_fetch` may reach besides the public internet.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum WebAccess {
    /// Public internet addresses only (the default).
    #[default]
    PublicOnly,
    /// Public addresses, and these hosts whatever their address.
    PublicAnd(Vec<AllowedHost>),
    /// Every address, private ones included (`allow-private: true`).
    Any,
}

/// Why an `allow-private` entry was refused; each message says how to write it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostEntryError {
    /// Not a host name or an IP address (a scheme, port, path, wildcard...).
    #[error(
        "`{entry}` is not a host name or an IP address; write names such as `localhost` or `internal.example` and addresses such as `127.0.0.1` or `::1`, without scheme, port, path or wildcard"
    )]
    NotAHost {
        /// The entry as written.
        entry: String,
    },
    /// A name a URL would read as an address (`127.1`, `8080`).
    #[error(
        "`{entry}` would be read as the IP address {address}; write addresses in their usual form (`127.0.0.1`, `::1`) and host names with a letter in them"
    )]
    ReadAsAddress {
        /// The entry as written.
        entry: String,
        /// The address a URL reads it as.
        address: String,
    },
}

/// One entry of `allow-private: [...]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AllowedHost {
    /// A host name (lowercase, punycode, no trailing dot): a URL naming it may reach
    /// whatever it resolves to.
    Name(String),
    /// An address: a URL naming it literally may reach it.
    Ip(IpAddr),
}

impl AllowedHost {
    /// Parses a host name or an IP address (`[::1]` and `::1` alike); anything with a
    /// scheme, port, path or wildcard is refused with a message that says how to write it.
    pub fn parse(entry: &str) -> Result<Self, HostEntryError> {
        let bad = || HostEntryError::NotAHost {
            entry: entry.to_string(),
        };
        let trimmed = entry.trim();
        let bare = trimmed
            .strip_prefix('[')
            .and_then(|s| s.strip_suffix(']'))
            .unwrap_or(trimmed);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(AllowedHost::Ip(ip));
        }
        let plain = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_';
        if trimmed.is_empty() || !trimmed.chars().all(|c| plain(c) || !c.is_ascii()) {
            return Err(bad());
        }
        // The URL parser normalises the entry the way it normalises the hosts of fetched
        // URLs (lowercase, punycode), so both compare alike.
        let url = Url::parse(&format!("http://{trimmed}/")).map_err(|_| bad())?;
        let host = url.host_str().ok_or_else(bad)?;
        if host.parse::<IpAddr>().is_ok() {
            // `127.1`, `0x7f.1`, `8080`: a URL reads them as addresses, which `8080` surely
            // did not mean; an address in its usual form leaves no doubt.
            return Err(HostEntryError::ReadAsAddress {
                entry: entry.to_string(),
                address: host.to_string(),
            });
        }
        Ok(AllowedHost::Name(host.trim_end_matches('.').to_string()))
    }
}

impl WebAccess {
    /// Whether a URL naming `host` (as `Url::host_str` or the resolver gives it) may reach
    /// it whatever its address.
    pub fn allows_host(&self, host: &str) -> bool {
        match self {
            WebAccess::PublicOnly => false,
            WebAccess::Any => true,
            WebAccess::PublicAnd(hosts) => {
                let host = host.trim_end_matches('.');
                let ip = host
                    .strip_prefix('[')
                    .and_then(|h| h.strip_suffix(']'))
                    .unwrap_or(host)
                    .parse::<IpAddr>()
                    .ok();
                hosts.iter().any(|allowed| match allowed {
                    AllowedHost::Name(name) => ip.is_none() && name.eq_ignore_ascii_case(host),
                    AllowedHost::Ip(allowed) => ip == Some(*allowed),
                })
            }
        }
    }

    /// Checks a URL whose host is an IP literal: the HTTP client connects to such an
    /// address without asking any resolver, so it is checked here. A URL naming a host
    /// name passes; its addresses are checked when it resolves ([`WebAccess::filter`]).
    pub fn check_literal(&self, url: &Url) -> Result<(), Refusal> {
        let Some(host) = url.host_str() else {
            return Ok(());
        };
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let Ok(ip) = bare.parse::<IpAddr>() else {
            return Ok(());
        };
        match restriction(ip) {
            Some(why) if !self.allows_host(host) => Err(Refusal {
                host: host.to_string(),
                literal: true,
                addresses: vec![(ip, why)],
                reached_from: None,
            }),
            _ => Ok(()),
        }
    }

    /// The addresses `host` resolved to that may be connected to: all of them when the host
    /// is allowed, otherwise the public ones. A refusal when none is left.
    pub fn filter(
        &self,
        host: &str,
        resolved: Vec<SocketAddr>,
    ) -> Result<Vec<SocketAddr>, Refusal> {
        if self.allows_host(host) {
            return Ok(resolved);
        }
        let mut refused = Vec::new();
        let mut kept = Vec::new();
        for addr in resolved {
            match restriction(addr.ip()) {
                Some(why) => refused.push((addr.ip(), why)),
                None => kept.push(addr),
            }
        }
        if kept.is_empty() && !refused.is_empty() {
            return Err(Refusal {
                host: host.to_string(),
                literal: false,
                addresses: refused,
                reached_from: None,
            });
        }
        Ok(kept)
    }
}

/// Why an address is not a public internet address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restriction {
    /// The kind of range: `loopback`, `private`, `link-local`...
    pub kind: &'static str,
    /// For an IPv6 address that embeds an IPv4 one: that address and how it is embedded
    /// (`in IPv4-mapped form`, `inside a 6to4 address`...).
    pub embedded: Option<(Ipv4Addr, &'static str)>,
}

impl fmt::Display for Restriction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.embedded {
            Some((v4, how)) => write!(f, "{}: {v4} {how}", self.kind),
            None => f.write_str(self.kind),
        }
    }
}

const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), prefix)
}

#[allow(clippy::too_many_arguments)] // the eight segments of an address, as written
const fn v6(a: u16, b: u16, c: u16, d: u16, e: u16, f: u16, g: u16, h: u16, prefix: u8) -> Ipv6Net {
    Ipv6Net::new_assert(Ipv6Addr::new(a, b, c, d, e, f, g, h), prefix)
}

/// IPv4 ranges that are not the public internet (IANA special-purpose registry), first
/// match wins. std's `Ipv4Addr::is_global` would say the same but is not stable.
const V4_RANGES: &[(Ipv4Net, &str)] = &[
    (v4(0, 0, 0, 0, 32), "unspecified"),
    (v4(0, 0, 0, 0, 8), "reserved \"this network\""),
    (v4(10, 0, 0, 0, 8), "private"),
    (v4(100, 64, 0, 0, 10), "shared carrier-grade NAT"),
    (v4(127, 0, 0, 0, 8), "loopback"),
    (v4(169, 254, 0, 0, 16), "link-local"),
    (v4(172, 16, 0, 0, 12), "private"),
    (v4(192, 0, 0, 0, 24), "reserved for IETF protocols"),
    (v4(192, 0, 2, 0, 24), "documentation"),
    (v4(192, 88, 99, 0, 24), "reserved 6to4 relay"),
    (v4(192, 168, 0, 0, 16), "private"),
    (v4(198, 18, 0, 0, 15), "benchmarking"),
    (v4(198, 51, 100, 0, 24), "documentation"),
    (v4(203, 0, 113, 0, 24), "documentation"),
    (v4(224, 0, 0, 0, 4), "multicast"),
    (v4(255, 255, 255, 255, 32), "broadcast"),
    (v4(240, 0, 0, 0, 4), "reserved"),
];

/// IPv6 ranges that are not the public internet and embed no IPv4 address, first match
/// wins (the embedding ranges are handled in [`restriction`]).
const V6_RANGES: &[(Ipv6Net, &str)] = &[
    (v6(0, 0, 0, 0, 0, 0, 0, 0, 128), "unspecified"),
    (v6(0, 0, 0, 0, 0, 0, 0, 1, 128), "loopback"),
    (v6(0x64, 0xff9b, 1, 0, 0, 0, 0, 0, 48), "local-use NAT64"),
    (v6(0x100, 0, 0, 0, 0, 0, 0, 0, 64), "discard-only"),
    (v6(0x2001, 0, 0, 0, 0, 0, 0, 0, 32), "Teredo tunnel"),
    (v6(0x2001, 2, 0, 0, 0, 0, 0, 0, 48), "benchmarking"),
    (v6(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0, 32), "documentation"),
    (v6(0xfc00, 0, 0, 0, 0, 0, 0, 0, 7), "private unique-local"),
    (v6(0xfe80, 0, 0, 0, 0, 0, 0, 0, 10), "link-local"),
    (v6(0xfec0, 0, 0, 0, 0, 0, 0, 0, 10), "private site-local"),
    (v6(0xff00, 0, 0, 0, 0, 0, 0, 0, 8), "multicast"),
];

/// `::/96`: the deprecated IPv4-compatible form, `::a.b.c.d`.
const V4_COMPATIBLE: Ipv6Net = v6(0, 0, 0, 0, 0, 0, 0, 0, 96);
/// `64:ff9b::/96`: NAT64, the IPv4 address in the last 32 bits.
const NAT64: Ipv6Net = v6(0x64, 0xff9b, 0, 0, 0, 0, 0, 0, 96);
/// `2002::/16`: 6to4, the IPv4 address in the 32 bits after the prefix.
const SIX_TO_FOUR: Ipv6Net = v6(0x2002, 0, 0, 0, 0, 0, 0, 0, 16);

fn v4_kind(addr: Ipv4Addr) -> Option<&'static str> {
    V4_RANGES
        .iter()
        .find(|(net, _)| net.contains(&addr))
        .map(|(_, kind)| *kind)
}

/// Why `ip` is not a public internet address, or `None` when it is one. An IPv6 address
/// that carries an IPv4 address (mapped, compatible, NAT64, 6to4) is judged by that
/// address, because that is where a connection to it ends up.
pub fn restriction(ip: IpAddr) -> Option<Restriction> {
    let plain = |kind| Restriction {
        kind,
        embedded: None,
    };
    let v6 = match ip {
        IpAddr::V4(v4) => return v4_kind(v4).map(plain),
        IpAddr::V6(v6) => v6,
    };
    let bits = u128::from(v6);
    let embedded = |v4: Ipv4Addr, how| {
        v4_kind(v4).map(|kind| Restriction {
            kind,
            embedded: Some((v4, how)),
        })
    };
    if v6.is_unspecified() || v6.is_loopback() {
        return V6_RANGES
            .iter()
            .find(|(net, _)| net.contains(&v6))
            .map(|(_, kind)| plain(kind));
    }
    if let Some(v4) = v6.to_ipv4_mapped() {
        return embedded(v4, "in IPv4-mapped form");
    }
    if V4_COMPATIBLE.contains(&v6) {
        // Deprecated and unrouted: refused even when the IPv4 address is public.
        return embedded(Ipv4Addr::from(bits as u32), "in IPv4-compatible form")
            .or(Some(plain("reserved IPv4-compatible")));
    }
    if NAT64.contains(&v6) {
        return embedded(Ipv4Addr::from(bits as u32), "inside a NAT64 address");
    }
    if SIX_TO_FOUR.contains(&v6) {
        return embedded(Ipv4Addr::from((bits >> 80) as u32), "inside a 6to4 address");
    }
    V6_RANGES
        .iter()
        .find(|(net, _)| net.contains(&v6))
        .map(|(_, kind)| plain(kind))
}

/// A destination `web_fetch` refused; its text (for the model) says what, why and what to
/// do instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The host as the URL names it.
    pub host: String,
    /// Whether the host is an IP literal (otherwise a name that resolved to `addresses`).
    pub literal: bool,
    /// The refused addresses, each with why.
    pub addresses: Vec<(IpAddr, Restriction)>,
    /// The URL the model asked for, when a redirect led to this host.
    pub reached_from: Option<String>,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = self
            .addresses
            .iter()
            .map(|(ip, why)| format!("{ip} ({why})"))
            .collect::<Vec<_>>()
            .join(", ");
        f.write_str("web_fetch refuses private and loopback addresses: ")?;
        if self.literal {
            write!(f, "{list}")?;
        } else {
            write!(f, "{} resolves only to {list}", self.host)?;
        }
        if let Some(from) = &self.reached_from {
            write!(f, ", reached through a redirect from {from}")?;
        }
        f.write_str(
            ". Such addresses lead into this machine or its private network (cloud metadata answers at 169.254.169.254), not to the public web. Fetch a public URL instead. If this run needs a local or internal service, the run's configuration can allow it with `web: {allow-private: true}`, or for some hosts only, e.g. `web: {allow-private: [localhost]}`.",
        )
    }
}

impl std::error::Error for Refusal {}

/// The refusal somewhere in the source chain of `err`, if a check of this module caused it.
pub fn find_refusal<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a Refusal> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(refusal) = e.downcast_ref::<Refusal>() {
            return Some(refusal);
        }
        current = e.source();
    }
    None
}

/// Resolves host names the way the system does (`getaddrinfo`, as reqwest's default
/// resolver) and hands the HTTP client only the addresses `access` allows.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    access: WebAccess,
}

impl GuardedResolver {
    /// A resolver enforcing `access`.
    pub fn new(access: WebAccess) -> Self {
        Self { access }
    }
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let access = self.access.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let kept = access.filter(&host, resolved)?;
            Ok(Box::new(kept.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// A redirect policy that follows at most `max` redirects and refuses a hop to an IP
/// literal that `access` does not allow (hops to host names are checked by
/// [`GuardedResolver`] when they connect).
pub fn redirect_policy(access: WebAccess, max: usize) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() > max {
            let error = format!("too many redirects (more than {max})");
            return attempt.error(error);
        }
        match access.check_literal(attempt.url()) {
            Ok(()) => attempt.follow(),
            Err(mut refusal) => {
                refusal.reached_from = attempt.previous().first().map(Url::to_string);
                attempt.error(refusal)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(addr: &str) -> Option<String> {
        restriction(addr.parse().unwrap()).map(|r| r.to_string())
    }

    #[test]
    fn addresses_are_classified() {
        let table: &[(&str, Option<&str>)] = &[
            // Public.
            ("8.8.8.8", None),
            ("1.1.1.1", None),
            ("100.63.255.255", None),
            ("100.128.0.0", None),
            ("172.15.255.255", None),
            ("172.32.0.0", None),
            ("169.253.255.255", None),
            ("2606:4700:4700::1111", None),
            ("::ffff:8.8.8.8", None),
            ("64:ff9b::808:808", None),
            ("2002:808:808::1", None),
            // IPv4.
            ("0.0.0.0", Some("unspecified")),
            ("0.1.2.3", Some("reserved \"this network\"")),
            ("127.0.0.1", Some("loopback")),
            ("127.255.255.254", Some("loopback")),
            ("10.0.0.1", Some("private")),
            ("172.16.0.1", Some("private")),
            ("172.31.255.255", Some("private")),
            ("192.168.1.1", Some("private")),
            ("169.254.169.254", Some("link-local")),
            ("100.64.0.1", Some("shared carrier-grade NAT")),
            ("100.127.255.255", Some("shared carrier-grade NAT")),
            ("192.0.0.8", Some("reserved for IETF protocols")),
            ("192.0.2.1", Some("documentation")),
            ("198.18.0.1", Some("benchmarking")),
            ("224.0.0.1", Some("multicast")),
            ("239.255.255.250", Some("multicast")),
            ("240.0.0.1", Some("reserved")),
            ("255.255.255.255", Some("broadcast")),
            // IPv6.
            ("::", Some("unspecified")),
            ("::1", Some("loopback")),
            ("fe80::1", Some("link-local")),
            ("fd00:ec2::254", Some("private unique-local")),
            ("fc00::1", Some("private unique-local")),
            ("fec0::1", Some("private site-local")),
            ("ff02::1", Some("multicast")),
            ("2001:db8::1", Some("documentation")),
            ("2001::1", Some("Teredo tunnel")),
            ("100::1", Some("discard-only")),
            ("64:ff9b:1::a00:1", Some("local-use NAT64")),
            // IPv6 carrying a non-public IPv4 address, in every form and spelling.
            (
                "::ffff:127.0.0.1",
                Some("loopback: 127.0.0.1 in IPv4-mapped form"),
            ),
            (
                "::ffff:7f00:1",
                Some("loopback: 127.0.0.1 in IPv4-mapped form"),
            ),
            (
                "::ffff:a9fe:a9fe",
                Some("link-local: 169.254.169.254 in IPv4-mapped form"),
            ),
            (
                "::ffff:10.1.2.3",
                Some("private: 10.1.2.3 in IPv4-mapped form"),
            ),
            (
                "::7f00:1",
                Some("loopback: 127.0.0.1 in IPv4-compatible form"),
            ),
            ("::808:808", Some("reserved IPv4-compatible")),
            (
                "64:ff9b::7f00:1",
                Some("loopback: 127.0.0.1 inside a NAT64 address"),
            ),
            (
                "64:ff9b::192.168.0.1",
                Some("private: 192.168.0.1 inside a NAT64 address"),
            ),
            (
                "2002:7f00:1::",
                Some("loopback: 127.0.0.1 inside a 6to4 address"),
            ),
            (
                "2002:a9fe:a9fe::1",
                Some("link-local: 169.254.169.254 inside a 6to4 address"),
            ),
        ];
        for (addr, expected) in table {
            assert_eq!(kind(addr).as_deref(), *expected, "{addr}");
        }
    }

    #[test]
    fn odd_spellings_of_loopback_in_urls_are_literals_and_refused() {
        for url in [
            "http://127.0.0.1/",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://0x7f000001:8080/x",
            "http://127.1/",
            "http://0177.0.0.1/",
            "http://127.000.000.001/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:7f00:1]/",
            "http://[0:0:0:0:0:ffff:7f00:1]/",
            "https://[::1]:443/",
        ] {
            let refusal = WebAccess::PublicOnly
                .check_literal(&Url::parse(url).unwrap())
                .unwrap_err();
            assert!(refusal.literal, "{url}");
            assert_eq!(refusal.addresses[0].1.kind, "loopback", "{url}");
            let text = refusal.to_string();
            assert!(
                text.contains("web_fetch refuses private and loopback addresses: ")
                    && text.contains("`web: {allow-private: true}`"),
                "{text}"
            );
        }
        let refusal = WebAccess::PublicOnly
            .check_literal(&Url::parse("http://169.254.169.254/latest/meta-data/").unwrap())
            .unwrap_err();
        assert!(
            refusal
                .to_string()
                .contains(": 169.254.169.254 (link-local). "),
            "{refusal}"
        );
        // Names are left to the resolver; public literals pass.
        for url in [
            "http://localhost/",
            "http://example.com/",
            "http://8.8.8.8/",
        ] {
            assert!(
                WebAccess::PublicOnly
                    .check_literal(&Url::parse(url).unwrap())
                    .is_ok(),
                "{url}"
            );
        }
    }

    #[test]
    fn allow_list_entries_parse_and_match_exactly() {
        let parse = |s: &str| AllowedHost::parse(s).unwrap();
        assert_eq!(parse("localhost"), AllowedHost::Name("localhost".into()));
        assert_eq!(
            parse("Internal.Example."),
            AllowedHost::Name("internal.example".into())
        );
        assert_eq!(
            parse("127.0.0.1"),
            AllowedHost::Ip("127.0.0.1".parse().unwrap())
        );
        for odd in ["127.1", "0x7f.0.0.1", "8080"] {
            let err = AllowedHost::parse(odd).unwrap_err();
            assert!(matches!(err, HostEntryError::ReadAsAddress { .. }), "{err}");
            assert!(
                err.to_string()
                    .starts_with(&format!("`{odd}` would be read as the IP address ")),
                "{err}"
            );
        }
        assert_eq!(parse("[::1]"), AllowedHost::Ip("::1".parse().unwrap()));
        assert_eq!(parse("::1"), AllowedHost::Ip("::1".parse().unwrap()));
        assert_eq!(
            parse("bücher.example"),
            AllowedHost::Name("xn--bcher-kva.example".into())
        );
        for bad in [
            "",
            "http://localhost",
            "localhost:8080",
            "localhost/x",
            "*.internal.example",
            "user@host",
            "a b",
        ] {
            let err = AllowedHost::parse(bad).unwrap_err();
            assert_eq!(
                err,
                HostEntryError::NotAHost {
                    entry: bad.to_string()
                }
            );
            assert!(
                err.to_string().contains("without scheme, port, path"),
                "{bad}: {err}"
            );
        }

        let access =
            WebAccess::PublicAnd(vec![parse("localhost"), parse("10.0.0.5"), parse("::1")]);
        assert!(access.allows_host("localhost"));
        assert!(access.allows_host("LOCALHOST."));
        assert!(access.allows_host("10.0.0.5"));
        assert!(access.allows_host("[::1]"));
        assert!(!access.allows_host("127.0.0.1"));
        assert!(!access.allows_host("10.0.0.6"));
        assert!(!access.allows_host("localhost.example"));
        assert!(!WebAccess::PublicOnly.allows_host("localhost"));
        assert!(WebAccess::Any.allows_host("anything"));

        let literal = |u: &str| access.check_literal(&Url::parse(u).unwrap());
        assert!(literal("http://10.0.0.5:8080/").is_ok());
        assert!(literal("http://[::1]/").is_ok());
        assert!(literal("http://127.0.0.1/").is_err());
        assert!(literal("http://10.0.0.6/").is_err());
        assert!(
            WebAccess::Any
                .check_literal(&Url::parse("http://127.0.0.1/").unwrap())
                .is_ok()
        );
    }

    #[test]
    fn resolved_addresses_are_filtered_unless_the_name_is_allowed() {
        let sock = |s: &str| SocketAddr::new(s.parse().unwrap(), 0);
        let mixed = vec![sock("10.0.0.1"), sock("93.184.215.14"), sock("::1")];
        assert_eq!(
            WebAccess::PublicOnly.filter("mixed.example", mixed.clone()),
            Ok(vec![sock("93.184.215.14")])
        );
        let refusal = WebAccess::PublicOnly
            .filter("localhost", vec![sock("127.0.0.1"), sock("::1")])
            .unwrap_err();
        assert!(!refusal.literal);
        assert!(
            refusal
                .to_string()
                .contains("localhost resolves only to 127.0.0.1 (loopback), ::1 (loopback). "),
            "{refusal}"
        );
        let allowed = WebAccess::PublicAnd(vec![AllowedHost::Name("mixed.example".into())]);
        assert_eq!(
            allowed.filter("mixed.example", mixed.clone()),
            Ok(mixed.clone())
        );
        assert_eq!(WebAccess::Any.filter("x", mixed.clone()), Ok(mixed));
        // Nothing resolved is the resolver's answer to give, not a refusal.
        assert_eq!(
            WebAccess::PublicOnly.filter("none.example", vec![]),
            Ok(vec![])
        );
    }
}
