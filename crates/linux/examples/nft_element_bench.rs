//! Per-change latency of "a pod joins a selected set" against a large `inet tern` table:
//! one `add element` + one `delete element` sent over nfnetlink ([`NftSocket`]) versus the same
//! change through `nft -f` (which loads the whole table first).
//!
//! The table (2,000 policy-like chains, each matching a named address set, plus the
//! `ep-in` verdict map) is built with `nft -f` in a fresh network namespace that only the
//! benchmark thread (and the `nft` processes it spawns) lives in. The root namespace is never
//! touched.
//!
//! `cargo run -p tern-linux --example nft_element_bench --release -- [chains] [samples]`

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use tern_linux::nft_netlink::NftSocket;
use tern_nft::{Element, ElementChange, Family, Key, SetType, TableChange};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Runs `f` and records how long it took in `samples`.
fn timed(samples: &mut Vec<Duration>, f: impl FnOnce()) {
    let t = Instant::now();
    f();
    samples.push(t.elapsed());
}

fn report(what: &str, mut v: Vec<Duration>) {
    v.sort();
    let total: Duration = v.iter().sum();
    println!(
        "{what:<34} n={:<4} mean={:>9.3?} p50={:>9.3?} p95={:>9.3?} max={:>9.3?}",
        v.len(),
        total / v.len() as u32,
        percentile(&v, 0.5),
        percentile(&v, 0.95),
        v[v.len() - 1],
    );
}

fn table(chains: usize) -> String {
    let mut s =
        String::from("add table inet tern\nadd map inet tern ep-in { type ifname : verdict; }\n");
    for i in 0..chains {
        let _ = writeln!(s, "add set inet tern sel-{i}-v4 {{ type ipv4_addr; }}");
        let _ = writeln!(s, "add chain inet tern pol-{i}-in");
        let _ = writeln!(
            s,
            "add rule inet tern pol-{i}-in ip saddr @sel-{i}-v4 tcp dport {} meta mark set meta mark or 0x10000 return",
            8000 + i % 50
        );
        // Every set starts with a few members, as in a real cluster.
        let _ = writeln!(
            s,
            "add element inet tern sel-{i}-v4 {{ 198.18.{}.1, 198.18.{}.2 }}",
            i % 250,
            i % 250
        );
    }
    s
}

fn main() {
    let mut args = std::env::args().skip(1);
    let chains: usize = args
        .next()
        .map(|s| s.parse().expect("chains"))
        .unwrap_or(2000);
    let samples: usize = args
        .next()
        .map(|s| s.parse().expect("samples"))
        .unwrap_or(200);
    std::thread::spawn(move || {
        // SAFETY: unshare only affects this dedicated thread (and processes it spawns).
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            panic!("unshare(CLONE_NEWNET): run as root");
        }
        let t = Instant::now();
        tern_linux::nft::apply(&table(chains)).expect("building the table with nft -f");
        println!(
            "table: {chains} chains + {chains} sets, built with nft -f in {:?}",
            t.elapsed()
        );
        let change = |set: usize, add, ip: Ipv4Addr| {
            TableChange::Element(ElementChange {
                set: format!("sel-{set}-v4"),
                set_type: SetType::addr(Family::V4),
                add,
                element: Element {
                    key: Key::Addr(ip.into()),
                    verdict: None,
                },
            })
        };
        let ip = |k: usize| Ipv4Addr::new(198, 19, (k / 250) as u8, (k % 250) as u8 + 1);
        let mut sock = NftSocket::new().expect("nfnetlink socket");
        let (mut nl_add, mut nl_del, mut nl_open_add) = (Vec::new(), Vec::new(), Vec::new());
        let (mut nft_add, mut nft_del) = (Vec::new(), Vec::new());
        let (mut nl_cached_add, mut nl_cached_del) = (Vec::new(), Vec::new());
        for k in 0..samples {
            let set = (k * 7919) % chains;
            // Built inside each timed step, as the agent builds its changes.
            let add = || [change(set, true, ip(k))];
            let del = || [change(set, false, ip(k))];
            let nft = |verb: &str| {
                let script = format!("{verb} element inet tern sel-{set}-v4 {{ {} }}\n", ip(k));
                tern_linux::nft::apply(&script).unwrap();
            };
            timed(&mut nl_add, || sock.apply("tern", &add()).unwrap());
            timed(&mut nl_del, || sock.apply("tern", &del()).unwrap());
            // A fresh socket per change: closing a socket that committed a transaction costs
            // the kernel milliseconds (nft -f pays it too), hence the cached socket below.
            timed(&mut nl_open_add, || {
                NftSocket::new()
                    .and_then(|mut s| s.apply("tern", &add()))
                    .unwrap()
            });
            // The agent's path: the thread's cached socket (opened once per namespace).
            timed(&mut nl_cached_del, || {
                tern_linux::nft_netlink::apply_cached("tern", &del()).unwrap()
            });
            timed(&mut nl_cached_add, || {
                tern_linux::nft_netlink::apply_cached("tern", &add()).unwrap()
            });
            timed(&mut nft_del, || nft("delete"));
            timed(&mut nft_add, || nft("add"));
            sock.apply("tern", &[change(set, false, ip(k))]).unwrap();
        }
        report("netlink add element", nl_add);
        report("netlink delete element", nl_del);
        report("netlink add (socket per change)", nl_open_add);
        report("netlink delete (cached socket)", nl_cached_del);
        report("netlink add (cached socket)", nl_cached_add);
        report("nft -f add element", nft_add);
        report("nft -f delete element", nft_del);
    })
    .join()
    .unwrap();
}
