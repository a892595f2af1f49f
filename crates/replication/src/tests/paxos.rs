//! Paxos rounds on a simulated three-node cluster: what a round leaves behind (a proposal
//! accepted by too few replicas, a commit that missed a replica) is finished by the next
//! round before anything newer is decided, and a lower ballot loses to a higher one.

use super::sim::{Behaviour, SimCluster, TABLE};
use crate::messages::{ReplicaRequest, ReplicaResponse};
use crate::paxos::{self, Ballot, PaxosKey, PreparedRound, Proposal, ProposalOutcome};
use crate::proxy::StorageProxy;
use crate::replica::read_visible;
use shoal_cql::request::Consistency;
use shoal_cql::{CqlError, ErrorCode};
use shoal_model::token::murmur3_token;
use shoal_model::{keys, Cell, WriteTimestamp};
use std::time::Duration;
use tokio::time::Instant;

fn key() -> PaxosKey {
    let partition_key = b"p".to_vec();
    PaxosKey {
        table: TABLE,
        token: murmur3_token(&partition_key),
        partition_key,
    }
}

/// One cell of the partition, written at `micros`.
fn update(micros: i64, value: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let key = key();
    let mut cell_key = keys::partition_prefix(&TABLE, key.token, &key.partition_key);
    cell_key.push(keys::SECTION_STATIC_ROW);
    vec![(
        cell_key,
        Cell::live(WriteTimestamp(micros), value.to_vec()).encode(),
    )]
}

/// The values of the partition's cells on node `index`.
fn values_on(cluster: &SimCluster, index: usize) -> Vec<Vec<u8>> {
    let key = key();
    let lower = keys::partition_prefix(&TABLE, key.token, &key.partition_key);
    let upper = keys::increment_prefix(&lower).unwrap();
    let (cells, _) =
        read_visible(cluster.nodes[index].engine.as_ref(), &lower, &upper, 100).unwrap();
    cells
        .into_iter()
        .map(|(_, cell)| Cell::decode(&cell).unwrap().value)
        .collect()
}

fn cluster() -> SimCluster {
    SimCluster::new(3, 3, Duration::from_secs(3600), 1 << 20)
}

fn deadline() -> Instant {
    Instant::now() + paxos::CAS_CONTENTION_TIMEOUT
}

/// A round prepared on the test partition through `proxy`, at SERIAL.
async fn prepare_through(proxy: &StorageProxy) -> Result<PreparedRound, CqlError> {
    paxos::prepare(proxy, &key(), Consistency::Serial, deadline()).await
}

/// Proposes `value` under `ballot` (written at the ballot's time) through `proxy`,
/// committed at `consistency`.
async fn propose_through(
    proxy: &StorageProxy,
    ballot: Ballot,
    value: &[u8],
    consistency: Consistency,
) -> Result<ProposalOutcome, CqlError> {
    let update = update(ballot.micros, value);
    paxos::propose(
        proxy,
        &key(),
        ballot,
        update,
        Consistency::Serial,
        consistency,
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn a_proposal_accepted_by_one_replica_is_finished_by_the_next_round() {
    let cluster = cluster();
    // A coordinator that died after one replica (n1) accepted its proposal.
    let ballot = Ballot {
        micros: 1_000,
        node: 9,
    };
    let node = cluster.nodes[0].proxy.local();
    let prepare = ReplicaRequest::PaxosPrepare {
        key: key(),
        ballot,
        read: false,
    };
    assert!(matches!(node.serve(prepare).await, ReplicaResponse::PaxosPromise(p) if p.promised));
    let proposal = Proposal {
        ballot,
        update: update(1_000, b"first"),
    };
    let propose = ReplicaRequest::PaxosPropose {
        key: key(),
        proposal,
    };
    assert!(matches!(
        node.serve(propose).await,
        ReplicaResponse::PaxosAccepted { accepted: true, .. }
    ));
    assert!(values_on(&cluster, 1).is_empty());
    // n3 is down, so the next round's quorum is n1 and n2: it sees the accepted proposal
    // and commits it before it goes on.
    cluster.set_behaviour(2, Behaviour::Down);
    let proxy = &cluster.nodes[1].proxy;
    let round = prepare_through(proxy.as_ref()).await.unwrap();
    assert_eq!(values_on(&cluster, 0), vec![b"first".to_vec()]);
    assert_eq!(values_on(&cluster, 1), vec![b"first".to_vec()]);
    // The new round's own update is newer than the one it finished.
    let outcome = propose_through(proxy.as_ref(), round.ballot, b"second", Consistency::Quorum)
        .await
        .unwrap();
    assert_eq!(outcome, ProposalOutcome::Committed);
    assert_eq!(values_on(&cluster, 1), vec![b"second".to_vec()]);
}

#[tokio::test(start_paused = true)]
async fn a_replica_that_missed_the_latest_commit_gets_it_before_a_new_proposal() {
    let cluster = cluster();
    cluster.set_behaviour(2, Behaviour::Down);
    let first = &cluster.nodes[0].proxy;
    let round = prepare_through(first.as_ref()).await.unwrap();
    let outcome = propose_through(first.as_ref(), round.ballot, b"decided", Consistency::All).await;
    // ALL cannot be met with n3 down, but the update is decided (a quorum accepted it).
    assert!(outcome.is_err());
    assert!(values_on(&cluster, 2).is_empty());
    // n3 is back and n1 is down: the next round's quorum is n2 and n3, and n3 is sent the
    // commit it missed before anything newer can be proposed.
    cluster.set_behaviour(2, Behaviour::Up);
    cluster.set_behaviour(0, Behaviour::Down);
    let second = &cluster.nodes[1].proxy;
    prepare_through(second.as_ref()).await.unwrap();
    assert_eq!(values_on(&cluster, 2), vec![b"decided".to_vec()]);
}

#[tokio::test(start_paused = true)]
async fn a_round_preempted_by_a_higher_ballot_decides_nothing() {
    let cluster = cluster();
    // Both rounds use the same quorum (n1 and n2), so the higher promise reaches every
    // replica the lower proposal is sent to.
    cluster.set_behaviour(2, Behaviour::Down);
    let (a, b) = (&cluster.nodes[0].proxy, &cluster.nodes[1].proxy);
    let lower = prepare_through(a.as_ref()).await.unwrap();
    let higher = prepare_through(b.as_ref()).await.unwrap();
    assert!(higher.ballot > lower.ballot);
    let preempted = propose_through(a.as_ref(), lower.ballot, b"lower", Consistency::Quorum)
        .await
        .unwrap();
    assert_eq!(preempted, ProposalOutcome::Preempted);
    let committed = propose_through(b.as_ref(), higher.ballot, b"higher", Consistency::Quorum)
        .await
        .unwrap();
    assert_eq!(committed, ProposalOutcome::Committed);
    for node in 0..3 {
        assert!(!values_on(&cluster, node).contains(&b"lower".to_vec()));
    }
}

/// The values of reconciled cells.
fn values_of(cells: &[(Vec<u8>, Vec<u8>)]) -> Vec<Vec<u8>> {
    cells
        .iter()
        .map(|(_, cell)| Cell::decode(cell).unwrap().value)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_promising_quorum_reads_the_partition_as_it_promises() {
    let cluster = cluster();
    let first = &cluster.nodes[0].proxy;
    let round = prepare_through(first.as_ref()).await.unwrap();
    assert_eq!(
        round.partition.map(|cells| values_of(&cells)),
        Some(Vec::new())
    );
    let outcome = propose_through(
        first.as_ref(),
        round.ballot,
        b"decided",
        Consistency::Quorum,
    )
    .await
    .unwrap();
    assert_eq!(outcome, ProposalOutcome::Committed);
    // The next round, from another coordinator, reads the decided update in its prepare.
    let second = &cluster.nodes[1].proxy;
    let round = prepare_through(second.as_ref()).await.unwrap();
    assert_eq!(
        round.partition.map(|cells| values_of(&cells)),
        Some(vec![b"decided".to_vec()])
    );
}

fn key_of(partition: &[u8]) -> PaxosKey {
    PaxosKey {
        table: TABLE,
        token: murmur3_token(partition),
        partition_key: partition.to_vec(),
    }
}

#[tokio::test(start_paused = true)]
async fn transactions_on_one_partition_take_turns_in_arrival_order() {
    let turns = std::sync::Arc::new(paxos::PartitionTurns::default());
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = turns
        .wait(&key(), deadline)
        .await
        .expect("a free partition");
    let order = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut waiting = Vec::new();
    for number in 0..3 {
        let (turns, order) = (std::sync::Arc::clone(&turns), std::sync::Arc::clone(&order));
        waiting.push(tokio::spawn(async move {
            let turn = turns.wait(&key(), deadline).await;
            order.lock().push(number);
            turn.is_some()
        }));
        // Each has asked before the next one does.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Another partition is not held up by this one.
    let other = turns.wait(&key_of(b"other"), deadline).await;
    assert!(other.is_some());
    assert!(
        order.lock().is_empty(),
        "a turn came while the first was held"
    );
    drop(first);
    for waiter in waiting {
        assert!(waiter.await.unwrap());
    }
    assert_eq!(*order.lock(), [0, 1, 2]);
}

#[tokio::test(start_paused = true)]
async fn a_turn_that_does_not_come_by_the_deadline_is_given_up() {
    let turns = paxos::PartitionTurns::default();
    let held = turns
        .wait(&key(), Instant::now() + Duration::from_secs(1))
        .await;
    assert!(held.is_some());
    let deadline = Instant::now() + Duration::from_millis(200);
    assert!(turns.wait(&key(), deadline).await.is_none());
    assert!(Instant::now() >= deadline);
}

#[tokio::test(start_paused = true)]
async fn finished_partitions_are_swept_from_the_table() {
    let turns = paxos::PartitionTurns::default();
    let deadline = Instant::now() + Duration::from_secs(1);
    let held = turns.wait(&key(), deadline).await;
    for number in 0..5000u32 {
        drop(turns.wait(&key_of(&number.to_be_bytes()), deadline).await);
    }
    // Swept whenever the table reached its bound: never more than the bound.
    assert!(turns.tracked() <= 1024, "{} entries", turns.tracked());
    drop(held);
}

/// Every Paxos state `engine` stores, as stored (what streaming sends).
fn stored_states(engine: &dyn shoal_storage::Engine) -> Vec<(Vec<u8>, Vec<u8>)> {
    let (lower, upper) = paxos::state_range(None, shoal_model::Token::MAX);
    let mut cursor = engine.scan(&lower, &upper, false).unwrap();
    let mut states = Vec::new();
    while let Some((key, value)) = cursor.current() {
        states.push((key.to_vec(), value.to_vec()));
        cursor.advance();
    }
    states
}

/// Promises, accepts and (with `commit`) commits `value` under ballot `micros` on one
/// replica, as a round would.
async fn decide_on(replica: &crate::LocalReplica, micros: i64, value: &[u8], commit: bool) {
    let ballot = Ballot { micros, node: 7 };
    let proposal = Proposal {
        ballot,
        update: update(micros, value),
    };
    let steps = [
        ReplicaRequest::PaxosPrepare {
            key: key(),
            ballot,
            read: false,
        },
        ReplicaRequest::PaxosPropose {
            key: key(),
            proposal: proposal.clone(),
        },
        ReplicaRequest::PaxosCommit {
            key: key(),
            proposal,
        },
    ];
    for step in steps.into_iter().take(if commit { 3 } else { 2 }) {
        let answer = replica.serve(step).await;
        assert!(
            !matches!(answer, ReplicaResponse::Error(_)),
            "a Paxos step failed: {answer:?}"
        );
    }
}

fn ballot_at(micros: i64) -> Option<Ballot> {
    Some(Ballot { micros, node: 7 })
}

#[tokio::test(start_paused = true)]
async fn a_replica_taking_over_a_tablet_joins_its_paxos_state_and_applies_the_newer_commit() {
    let cluster = cluster();
    let (source, target) = (
        cluster.nodes[0].proxy.local(),
        cluster.nodes[1].proxy.local(),
    );
    decide_on(source, 100, b"committed", true).await;
    let streamed = stored_states(source.engine.as_ref());
    assert_eq!(streamed.len(), 1);
    assert!(paxos::is_state_of(&streamed[0].0, &TABLE));
    // The commit comes with its update: the new replica never reports a commit it does
    // not hold the data of.
    let (state_key, stored) = &streamed[0];
    assert!(target.absorb_paxos_state(state_key, stored).await.unwrap());
    assert_eq!(values_on(&cluster, 1), vec![b"committed".to_vec()]);
    let ballots = paxos::stored_ballots(target.engine.as_ref(), &key()).unwrap();
    assert_eq!(ballots, [ballot_at(100), None, ballot_at(100)]);
    // What the target has since promised and accepted is newer: joining the old state
    // again changes nothing.
    decide_on(target, 300, b"accepted", false).await;
    assert!(!target.absorb_paxos_state(state_key, stored).await.unwrap());
    let ballots = paxos::stored_ballots(target.engine.as_ref(), &key()).unwrap();
    assert_eq!(ballots, [ballot_at(300), ballot_at(300), ballot_at(100)]);
    // A newer commit from the source finishes the target's older acceptance.
    decide_on(source, 400, b"newer", true).await;
    let streamed = stored_states(source.engine.as_ref());
    assert!(target
        .absorb_paxos_state(&streamed[0].0, &streamed[0].1)
        .await
        .unwrap());
    let ballots = paxos::stored_ballots(target.engine.as_ref(), &key()).unwrap();
    assert_eq!(ballots, [ballot_at(400), None, ballot_at(400)]);
    assert_eq!(values_on(&cluster, 1), vec![b"newer".to_vec()]);
}

#[tokio::test(start_paused = true)]
async fn forgetting_a_tablets_paxos_state_leaves_other_tables_and_tokens_alone() {
    let cluster = cluster();
    let replica = cluster.nodes[0].proxy.local();
    let other_table = shoal_model::TableId([0x11; 16]);
    let tablet_key = key();
    let elsewhere = key_of(b"elsewhere");
    let other_tables_key = PaxosKey {
        table: other_table,
        ..key()
    };
    for key in [&tablet_key, &elsewhere, &other_tables_key] {
        let prepare = ReplicaRequest::PaxosPrepare {
            key: key.clone(),
            ballot: Ballot {
                micros: 100,
                node: 7,
            },
            read: false,
        };
        assert!(
            matches!(replica.serve(prepare).await, ReplicaResponse::PaxosPromise(p) if p.promised)
        );
    }
    // The tablet holding only the test partition's token, in TABLE.
    let token = tablet_key.token;
    assert_ne!(elsewhere.token, token);
    let forgotten =
        paxos::forget_state(replica, TABLE, Some(shoal_model::Token(token.0 - 1)), token)
            .await
            .unwrap();
    assert_eq!(forgotten, 1);
    let promised = |key: &PaxosKey| paxos::stored_ballots(replica.engine.as_ref(), key).unwrap()[0];
    assert_eq!(promised(&tablet_key), None);
    assert_eq!(promised(&elsewhere), ballot_at(100));
    assert_eq!(promised(&other_tables_key), ballot_at(100));
    // A promise made after the state was forgotten is kept as usual.
    let prepare = ReplicaRequest::PaxosPrepare {
        key: tablet_key.clone(),
        ballot: Ballot {
            micros: 50,
            node: 7,
        },
        read: false,
    };
    assert!(matches!(replica.serve(prepare).await, ReplicaResponse::PaxosPromise(p) if p.promised));
    assert_eq!(promised(&tablet_key), ballot_at(50));
}

/// One transaction through `proxy`: turn, prepare, propose `value`; the proposal's
/// outcome and how many prepares it took.
async fn transaction_through(proxy: &StorageProxy, value: &[u8]) -> (ProposalOutcome, usize) {
    let key = key();
    let deadline = deadline();
    let mut turn = proxy.paxos_turn(&key, deadline).await;
    let mut prepares = 0;
    loop {
        prepares += 1;
        let round = proxy
            .prepare_under(&key, Consistency::Serial, deadline, &mut turn)
            .await
            .unwrap();
        let outcome = proxy
            .propose_under(
                &key,
                round.ballot,
                update(round.ballot.micros, value),
                Consistency::Serial,
                Consistency::Quorum,
                &mut turn,
            )
            .await
            .unwrap();
        if outcome == ProposalOutcome::Committed {
            return (outcome, prepares);
        }
    }
}

/// The node leading the test partition's transactions: its first replica.
fn leader_index(cluster: &SimCluster) -> usize {
    let state = cluster.nodes[0].proxy.topology().state();
    let first = cluster.nodes[0]
        .proxy
        .replicas_of(&state, &TABLE, key().token)
        .replicas[0]
        .host_id;
    cluster
        .nodes
        .iter()
        .position(|n| n.member.host_id == first)
        .unwrap()
}

/// Marks the test partition busy on every node (as contention seen there would).
fn mark_busy_everywhere(cluster: &SimCluster) {
    for node in &cluster.nodes {
        node.proxy.hot_partitions.mark(&key());
    }
}

#[tokio::test(start_paused = true)]
async fn a_partition_is_handed_to_its_leader_once_its_rounds_meet_another_coordinators_ballot() {
    let cluster = cluster();
    let leader = leader_index(&cluster);
    let coordinator = &cluster.nodes[(leader + 1) % 3].proxy;
    // Calm: the node the client picked runs the rounds itself.
    let turn = coordinator.paxos_turn(&key(), deadline()).await;
    assert!(!turn.is_led_elsewhere());
    drop(turn);
    assert_eq!(
        transaction_through(coordinator, b"calm").await,
        (ProposalOutcome::Committed, 1)
    );
    // Another coordinator's higher ballot, promised by every replica: the next round
    // meets it, tries again above it, and the partition counts as busy from then on.
    let higher = Ballot {
        micros: shoal_model::timestamp::now_micros() + 1_000,
        node: 9,
    };
    for node in &cluster.nodes {
        let prepare = ReplicaRequest::PaxosPrepare {
            key: key(),
            ballot: higher,
            read: false,
        };
        assert!(
            matches!(node.proxy.local().serve(prepare).await, ReplicaResponse::PaxosPromise(p) if p.promised)
        );
    }
    let (outcome, prepares) = transaction_through(coordinator, b"contended").await;
    assert_eq!((outcome, prepares), (ProposalOutcome::Committed, 1));
    let turn = coordinator.paxos_turn(&key(), deadline()).await;
    assert!(turn.is_led_elsewhere());
    drop(turn);
    // The leader itself always runs its partition's rounds.
    cluster.nodes[leader].proxy.hot_partitions.mark(&key());
    let turn = cluster.nodes[leader]
        .proxy
        .paxos_turn(&key(), deadline())
        .await;
    assert!(!turn.is_led_elsewhere());
    drop(turn);
    // Once the partition has been calm for a while, the coordinator runs it again.
    tokio::time::sleep(crate::paxos_lead::HOT_FOR).await;
    assert!(!coordinator
        .paxos_turn(&key(), deadline())
        .await
        .is_led_elsewhere());
}

#[tokio::test(start_paused = true)]
async fn transactions_through_every_coordinator_take_turns_on_the_partitions_leader() {
    let cluster = cluster();
    let leader = leader_index(&cluster);
    mark_busy_everywhere(&cluster);
    for (index, node) in cluster.nodes.iter().enumerate() {
        let turn = node.proxy.paxos_turn(&key(), deadline()).await;
        assert_eq!(turn.is_led_elsewhere(), index != leader, "node {index}");
    }
    // Ten transactions through each node at once: the leader runs every round, one after
    // another, so none is preempted by another's ballot and each needs one prepare.
    let transactions = cluster.nodes.iter().flat_map(|node| {
        (0..10).map(move |i| {
            let proxy = std::sync::Arc::clone(&node.proxy);
            async move { transaction_through(&proxy, format!("v{i}").as_bytes()).await }
        })
    });
    let outcomes = futures::future::join_all(transactions).await;
    assert_eq!(outcomes.len(), 30);
    assert!(outcomes
        .iter()
        .all(|outcome| *outcome == (ProposalOutcome::Committed, 1)));
    // Every lease the leader granted has ended.
    assert_eq!(cluster.nodes[leader].proxy.paxos_leases.count(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_transaction_that_proposes_nothing_ends_its_lease_when_dropped() {
    let cluster = cluster();
    let leader = leader_index(&cluster);
    mark_busy_everywhere(&cluster);
    let other = (leader + 1) % 3;
    let proxy = &cluster.nodes[other].proxy;
    let mut turn = proxy.paxos_turn(&key(), deadline()).await;
    proxy
        .prepare_under(&key(), Consistency::Serial, deadline(), &mut turn)
        .await
        .unwrap();
    let leases = || cluster.nodes[leader].proxy.paxos_leases.count();
    assert_eq!(leases(), 1);
    // Its conditions failed: the turn is dropped and the leader told.
    drop(turn);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(leases(), 0);
    // Another transaction through the same node gets the partition's turn at once.
    let (outcome, prepares) = transaction_through(proxy, b"next").await;
    assert_eq!((outcome, prepares), (ProposalOutcome::Committed, 1));
}

#[tokio::test(start_paused = true)]
async fn a_lease_its_coordinator_never_ends_expires_after_the_transactions_deadline() {
    let cluster = cluster();
    let leader = leader_index(&cluster);
    mark_busy_everywhere(&cluster);
    let proxy = &cluster.nodes[(leader + 1) % 3].proxy;
    let mut turn = proxy.paxos_turn(&key(), deadline()).await;
    proxy
        .prepare_under(&key(), Consistency::Serial, deadline(), &mut turn)
        .await
        .unwrap();
    // The coordinator dies: its turn is never dropped.
    std::mem::forget(turn);
    let leases = || cluster.nodes[leader].proxy.paxos_leases.count();
    assert_eq!(leases(), 1);
    tokio::time::sleep(paxos::CAS_CONTENTION_TIMEOUT + crate::paxos_lead::LEASE_GRACE).await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(leases(), 0);
    let (outcome, _) = transaction_through(cluster.nodes[leader].proxy.as_ref(), b"after").await;
    assert_eq!(outcome, ProposalOutcome::Committed);
}

#[tokio::test(start_paused = true)]
async fn with_the_leader_down_the_coordinator_runs_the_rounds_itself() {
    let cluster = cluster();
    let leader = leader_index(&cluster);
    mark_busy_everywhere(&cluster);
    cluster.set_behaviour(leader, Behaviour::Down);
    let proxy = &cluster.nodes[(leader + 1) % 3].proxy;
    // The next live replica leads: this node, or the third one.
    let (outcome, _) = transaction_through(proxy, b"decided").await;
    assert_eq!(outcome, ProposalOutcome::Committed);
    assert_eq!(
        values_on(&cluster, (leader + 1) % 3),
        vec![b"decided".to_vec()]
    );
}

#[tokio::test(start_paused = true)]
async fn a_lease_answers_only_for_the_partition_it_was_granted_on() {
    use crate::paxos_lead::{LeadRequest, LeadResponse};
    let cluster = cluster();
    let leader = &cluster.nodes[leader_index(&cluster)].proxy;
    let prepare = LeadRequest::Prepare {
        key: key(),
        serial: Consistency::Serial.code(),
        lease: None,
        within_micros: 1_000_000,
    };
    let LeadResponse::Prepared {
        lease,
        round: Ok(round),
        ..
    } = leader.lead(prepare).await
    else {
        panic!("the leader did not prepare");
    };
    assert_eq!(leader.paxos_leases.count(), 1);
    // The same number naming another partition neither ends the lease nor proposes.
    let other = key_of(b"other");
    let release = LeadRequest::Release {
        key: other.clone(),
        lease,
    };
    assert!(matches!(leader.lead(release).await, LeadResponse::Released));
    assert_eq!(leader.paxos_leases.count(), 1);
    let propose = LeadRequest::Propose {
        key: other,
        lease,
        ballot: round.ballot,
        update: update(round.ballot.micros, b"elsewhere"),
        serial: Consistency::Serial.code(),
        consistency: Consistency::Quorum.code(),
    };
    // Refused as a contention timeout that names the quorum a SERIAL round of three
    // replicas needs (two), not a made-up one.
    let LeadResponse::Proposed(Err(refused)) = leader.lead(propose).await else {
        panic!("a proposal under another partition's lease went through");
    };
    assert_eq!(
        refused.code,
        ErrorCode::WriteTimeout {
            consistency: Consistency::Serial.code(),
            received: 0,
            block_for: 2,
            write_type: "CAS".into(),
        }
    );
    assert_eq!(leader.paxos_leases.count(), 1);
    // Its own partition's proposal goes through and ends it.
    let propose = LeadRequest::Propose {
        key: key(),
        lease,
        ballot: round.ballot,
        update: update(round.ballot.micros, b"mine"),
        serial: Consistency::Serial.code(),
        consistency: Consistency::Quorum.code(),
    };
    assert!(matches!(
        leader.lead(propose).await,
        LeadResponse::Proposed(Ok(ProposalOutcome::Committed))
    ));
    assert_eq!(leader.paxos_leases.count(), 0);
}
