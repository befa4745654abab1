mod common;
use common::*;
use std::sync::Arc;
#[test]
fn dbg_parallel() {
    let node = Arc::new(Node::new());
    let pods: Vec<Arc<Pod>> = (0..30).map(|_| Arc::new(Pod::new())).collect();
    let conf = node.conf("1.0.0");
    let run_all = |cmd: &'static str| -> Vec<Out> {
        let hs: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let (node, pod, conf) = (node.clone(), pod.clone(), conf.clone());
                std::thread::spawn(move || node.cni(cmd, &pod, &format!("par{i}"), "eth0", &conf))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    };
    let adds = run_all("ADD");
    let names: Vec<String> = adds.iter().map(|o| result_host_if(&o.json)).collect();
    eprintln!("links after add: {}", node.tern_links().len());
    eprintln!("endpoints: {:?}", node.endpoints().len());
    std::thread::sleep(std::time::Duration::from_millis(1500));
    eprintln!("links after 1.5s: {}", node.tern_links().len());
    let d0 = node.cni("DEL", &pods[0], "par0", "eth0", &conf);
    eprintln!(
        "seq DEL par0: {} {:?} left={}",
        d0.status,
        d0.json,
        node.tern_links().contains(&names[0])
    );
    eprintln!("journal: {:?}", node.journal_files());
    let dels = run_all("DEL");
    eprintln!("journal: {:?}", node.journal_files());
    let left = node.tern_links();
    for (i, n) in names.iter().enumerate() {
        eprintln!(
            "par{i} {n} left={} del={} pod_eth0={:?}",
            left.contains(n),
            dels[i].status,
            pods[i].ipv4("eth0")
        );
    }
    eprintln!(
        "{}",
        node.agent_log()
            .lines()
            .filter(|l| !l.contains("DEBUG"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
