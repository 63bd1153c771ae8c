//! Where a rank listens: on all interfaces by default, as TensorFlow's servers do, so the host
//! in the cluster spec is only how peers reach it; or on the interface given.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::thread;
use std::time::Duration;

use crate::common::{free_addresses, fresh_cluster, listeners};
use lockstep_collective::{
    CommunicationOptions, Communicator, ReduceOp, TcpOptions, TcpTransport, Transport as _,
};

fn options() -> TcpOptions {
    TcpOptions {
        cluster: fresh_cluster(),
        rendezvous_timeout: Duration::from_secs(20),
        ..TcpOptions::default()
    }
}

#[test]
fn a_rank_whose_spec_host_is_no_name_of_this_machine_still_listens_and_forms_the_group() {
    // Rank 0's name resolves nowhere (as a Kubernetes service name may not, inside its own
    // pod): it listens on all interfaces at its port and dials rank 1, which accepts.
    let port = free_addresses(1)[0].rsplit(':').next().unwrap().to_owned();
    let (mut held, mut addresses) = listeners(1);
    addresses.insert(0, format!("lockstep-rank-0.invalid:{port}"));
    let options = options();
    let (a, o) = (addresses.clone(), options.clone());
    let rank0 = thread::spawn(move || TcpTransport::connect(0, &a, &o));
    let rank1 = TcpTransport::connect_on(held.remove(0), 1, &addresses, &options).unwrap();
    let rank0 = rank0.join().unwrap().unwrap();
    let handles: Vec<_> = [rank0, rank1]
        .into_iter()
        .map(|t| {
            thread::spawn(move || {
                let mut comm = Communicator::new(t, CommunicationOptions::default());
                let mut data = [comm.rank() as f32 + 1.0];
                comm.all_reduce(&mut data, ReduceOp::Sum).unwrap();
                data[0]
            })
        })
        .collect();
    let sums: Vec<f32> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(sums, [3.0, 3.0]);
}

#[test]
fn a_port_in_use_is_an_error_naming_the_port_and_the_address() {
    let taken = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
    let port = taken.local_addr().unwrap().port();
    let addresses = vec![format!("localhost:{port}"), free_addresses(1)[0].clone()];
    let err = TcpTransport::connect(0, &addresses, &options())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains(&format!("0.0.0.0:{port}"))
            && err.contains(&format!("localhost:{port}"))
            && err.to_lowercase().contains("in use"),
        "{err}"
    );
}

#[test]
fn a_bind_address_restricts_the_listener_to_that_interface() {
    // Listening on 127.0.0.1 only leaves the port free on another loopback address.
    let port = free_addresses(1)[0].rsplit(':').next().unwrap().to_owned();
    let (mut held, mut addresses) = listeners(1);
    addresses.insert(0, format!("127.0.0.1:{port}"));
    let options = TcpOptions {
        bind: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        ..options()
    };
    let (a, o) = (addresses.clone(), options.clone());
    let rank0 = thread::spawn(move || TcpTransport::connect(0, &a, &o));
    let rank1 = TcpTransport::connect_on(held.remove(0), 1, &addresses, &options).unwrap();
    let rank0 = rank0.join().unwrap().unwrap();
    let elsewhere = TcpListener::bind((Ipv4Addr::new(127, 0, 0, 2), port.parse().unwrap()));
    assert!(elsewhere.is_ok(), "{elsewhere:?}");
    assert_eq!((rank0.world_size(), rank1.world_size()), (2, 2));
}
