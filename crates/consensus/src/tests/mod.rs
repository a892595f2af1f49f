//! Simulation tests: several nodes, many groups, a network that delays, drops and
//! partitions, durable writes that take time, crashes that lose everything not yet
//! durable, and restarts from what was. Every run checks Raft's safety properties:
//!
//! - at most one leader per group and term;
//! - every node applies the same entry at the same index of a group;
//! - a proposal seen committed is applied by every member that gets that far, and nothing
//!   applied is ever lost by a restart.
//!
//! and, once the network heals, liveness: every group elects a leader and commits.

mod scripted;
mod sim;

use sim::{Fault, Simulation};

/// How many random schedules a test runs: `default`, or `SHOAL_SIM_SEEDS` for a longer
/// search (`SHOAL_SIM_SEEDS=2000 cargo test --release -p shoal-consensus`).
fn seeds(default: u64) -> u64 {
    std::env::var("SHOAL_SIM_SEEDS")
        .ok()
        .and_then(|seeds| seeds.parse().ok())
        .unwrap_or(default)
}

#[test]
fn a_quiet_cluster_elects_leaders_and_commits_in_order() {
    let mut sim = Simulation::new(3, 8, 1);
    sim.run_until_leaders(5_000);
    let committed = sim.propose_and_wait(200, 5_000);
    assert_eq!(
        committed, 200,
        "every proposal commits on a healthy cluster"
    );
    sim.settle(2_000);
    sim.check_all_applied_everywhere();
}

#[test]
fn one_durable_write_per_epoch_carries_many_groups() {
    let mut sim = Simulation::new(3, 16, 2);
    sim.run_until_leaders(5_000);
    sim.reset_counters();
    let committed = sim.propose_and_wait(2_000, 10_000);
    assert_eq!(committed, 2_000);
    // Many proposals share each durable write and each batch to a follower node.
    let writes = sim.persist_writes();
    assert!(
        writes * 4 < 2_000,
        "{writes} durable writes for 2,000 proposals: epochs are not shared"
    );
    let batches = sim.batches_sent();
    assert!(
        batches * 2 < 2_000 * 2,
        "{batches} batches for 2,000 proposals to two followers each"
    );
}

#[test]
fn a_leader_that_is_cut_off_is_replaced_and_its_uncommitted_entries_are_not_applied() {
    let mut sim = Simulation::new(3, 4, 3);
    sim.run_until_leaders(5_000);
    sim.propose_and_wait(20, 5_000);
    let isolated = sim.leader_of_most_groups();
    sim.fault(Fault::Isolate(isolated));
    // Proposals to the isolated leader cannot commit.
    sim.propose_on(isolated, 10);
    sim.run(4_000);
    sim.run_until_leaders_without(isolated, 10_000);
    assert_eq!(sim.propose_and_wait(20, 5_000), 20);
    sim.fault(Fault::Heal);
    sim.settle(5_000);
    sim.check_all_applied_everywhere();
}

#[test]
fn crashes_lose_only_what_was_never_durable() {
    let mut sim = Simulation::new(3, 4, 4);
    sim.run_until_leaders(5_000);
    sim.propose_and_wait(50, 5_000);
    for round in 0..3 {
        let victim = sim.node(round % 3);
        sim.propose_on(victim, 5);
        sim.fault(Fault::Crash(victim));
        sim.run(3_000);
        sim.fault(Fault::Restart(victim));
        sim.run_until_leaders(10_000);
        assert_eq!(sim.propose_and_wait(20, 10_000), 20);
    }
    sim.settle(5_000);
    sim.check_all_applied_everywhere();
}

#[test]
fn random_schedules_keep_every_safety_property() {
    // Each seed is a different interleaving of proposals, losses, partitions, crashes
    // and restarts; the checks run on every step.
    for seed in 0..seeds(24) {
        let mut sim = Simulation::new(5, 6, 100 + seed);
        sim.chaos(20_000, 4);
        sim.fault(Fault::Heal);
        sim.restart_all_crashed();
        sim.run_until_leaders(20_000);
        assert!(
            sim.propose_and_wait(20, 20_000) == 20,
            "seed {seed}: the healed cluster does not commit"
        );
        sim.settle(5_000);
        sim.check_all_applied_everywhere();
        sim.check_applied_entries_forgotten();
    }
}

#[test]
fn a_lease_is_never_held_by_two_leaders_at_once() {
    for seed in 0..seeds(12) {
        let mut sim = Simulation::new(3, 3, 500 + seed);
        sim.check_leases(true);
        // Few writes: a member cut off from the leader stays as up to date as the others,
        // so only leader stickiness keeps it from being elected while the lease runs.
        sim.chaos(15_000, 500);
    }
}
