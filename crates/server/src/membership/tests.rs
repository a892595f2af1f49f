use super::*;

#[test]
fn hearing_from_a_peer_that_was_not_up_wakes_whoever_waits_for_one() {
    let detector = FailureDetector::new(HostId([1; 16]));
    let mut came_up = detector.subscribe_came_up();
    let peer = HostId([2; 16]);
    detector.heard_from(peer, [0; 16], 0);
    assert!(came_up.has_changed().unwrap(), "a new peer came up");
    came_up.mark_unchanged();
    detector.heard_from(peer, [0; 16], 0);
    assert!(
        !came_up.has_changed().unwrap(),
        "a peer already up did not come up again"
    );
    // Only our own pings decide: a ping from another peer wakes nobody.
    detector.noted(HostId([3; 16]), [0; 16], 0);
    assert!(!came_up.has_changed().unwrap());
    assert!(detector.is_alive(&peer));
}
