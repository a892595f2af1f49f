use super::*;

fn member(id: u8) -> Member {
    Member {
        host_id: HostId([id; 16]),
        internode_address: SocketAddr::from(([127, 0, 0, id], 7000)),
        cql_address: SocketAddr::from(([127, 0, 0, id], 9042)),
        datacenter: "datacenter1".into(),
        rack: "rack1".into(),
        state: MemberState::Normal,
        replaces: None,
    }
}

/// Member `id`, joining.
fn joining(id: u8) -> Member {
    Member {
        state: MemberState::Joining,
        ..member(id)
    }
}

fn schema(version: u8) -> VersionedRecord {
    VersionedRecord {
        version: [version; 16],
        bytes: vec![version],
    }
}

#[test]
fn schema_changes_are_compare_and_set_on_the_version() {
    let mut state = ClusterState::default();
    state.apply(Command::AddMember(member(1)));
    let first = Command::ChangeSchema {
        base_version: None,
        schema: schema(1),
        tables: BTreeMap::new(),
    };
    assert_eq!(state.apply(first.clone()), CommandOutcome::Applied);
    // The same change again was computed from a schema that is gone.
    assert_eq!(state.apply(first), CommandOutcome::Moved);
    let second = Command::ChangeSchema {
        base_version: Some([1; 16]),
        schema: schema(2),
        tables: BTreeMap::from([(TableId([9; 16]), ReplicationStrategy::Simple { factor: 3 })]),
    };
    assert_eq!(state.apply(second), CommandOutcome::Applied);
    assert_eq!(state.schema, Some(schema(2)));
    assert_eq!(state.tables.len(), 1);
}

const TABLE: TableId = TableId([9; 16]);

/// Three normal members and one table of factor `factor`.
fn three_nodes_one_table(factor: usize) -> ClusterState {
    let mut state = ClusterState::default();
    for id in 1..=3 {
        state.apply(Command::AddMember(member(id)));
    }
    state.apply(Command::ChangeSchema {
        base_version: None,
        schema: schema(1),
        tables: BTreeMap::from([(TABLE, ReplicationStrategy::Simple { factor })]),
    });
    state
}

fn tablet(state: &ClusterState, id: u64) -> &shoal_placement::Tablet {
    state.tables[&TABLE].tablets.get(TabletId(id)).unwrap()
}

#[test]
fn drivers_route_by_a_table_only_while_every_normal_member_leads_some_of_it() {
    let mut state = three_nodes_one_table(1);
    state.apply(Command::AddMember(joining(4)));
    // While the fourth node joins, the table is the ring: it has no tokens yet.
    for id in 1..=3u8 {
        let host = HostId([id; 16]);
        assert_eq!(
            state.tokens_of(&host, |_| true),
            state.tables[&TABLE].tablets.tokens_of(&host)
        );
    }
    assert!(state.tokens_of(&HostId([4; 16]), |_| true).is_empty());
    // A table drivers are not routed by (a system one) never is the ring; the ring a
    // new table would have, over normal members, is.
    assert!(state.tokens_of(&HostId([4; 16]), |_| false).is_empty());
    assert_eq!(
        state.tokens_of(&HostId([1; 16]), |_| false).len(),
        TABLETS_PER_NODE
    );
    // Normal but leading nothing there: every node reports the ring a new table gets.
    state.apply(Command::SetMemberState {
        host_id: HostId([4; 16]),
        from: vec![MemberState::Joining],
        to: MemberState::Normal,
    });
    let all: Vec<Token> = (1..=4u8)
        .flat_map(|id| state.tokens_of(&HostId([id; 16]), |_| true))
        .collect();
    assert_eq!(all.len(), 4 * TABLETS_PER_NODE);
    assert_eq!(
        state.tokens_of(&HostId([4; 16]), |_| true).len(),
        TABLETS_PER_NODE
    );
}

#[test]
fn a_split_tablet_keeps_its_replicas_and_takes_its_table_out_of_the_drivers_ring() {
    let mut state = three_nodes_one_table(2);
    let first = state.tables[&TABLE].tablets.tablets()[0].clone();
    let version = state.topology_version;
    let split = Command::SplitTablet {
        table: TABLE,
        tablet: first.id,
        at: Token(first.last_token.0 - 1000),
    };
    assert_eq!(state.apply(split.clone()), CommandOutcome::Applied);
    assert!(state.topology_version > version, "routing changed");
    let tablets = state.tables[&TABLE].tablets.tablets();
    assert_eq!(tablets.len(), 3 * TABLETS_PER_NODE + 1);
    assert_eq!(tablets[0].last_token, Token(first.last_token.0 - 1000));
    assert_eq!(tablets[1].last_token, first.last_token);
    assert!(tablets[..2].iter().all(|t| t.replicas == first.replicas));
    // The old tablet is gone: the same split again is refused, not applied twice.
    assert!(matches!(state.apply(split), CommandOutcome::Rejected(_)));
    // Drivers keep routing by an even layout, not by the split table's.
    let ring: Vec<Token> = state
        .ring_tokens(|_| true)
        .into_values()
        .flatten()
        .collect();
    assert_eq!(ring.len(), 3 * TABLETS_PER_NODE);
    assert!(!ring.contains(&Token(first.last_token.0 - 1000)));
}

#[test]
fn a_strong_split_is_planned_then_finished_once_or_abandoned_and_holds_its_tablet_still() {
    let mut state = three_nodes_one_table(2);
    let first = state.tables[&TABLE].tablets.tablets()[0].clone();
    let at = Token(first.last_token.0 - 1000);
    let plan = Command::PlanStrongSplit {
        table: TABLE,
        tablet: first.id,
        at,
    };
    let version = state.topology_version;
    assert_eq!(state.apply(plan.clone()), CommandOutcome::Applied);
    // Planning routes nothing differently; the tablet is whole until the finish.
    assert_eq!(state.topology_version, version);
    assert_eq!(
        state.tables[&TABLE].tablets.tablets().len(),
        3 * TABLETS_PER_NODE
    );
    assert!(matches!(state.apply(plan), CommandOutcome::Rejected(_)));
    // A planned tablet does not move.
    let elsewhere = (1..=3u8)
        .map(|id| HostId([id; 16]))
        .find(|h| !first.replicas.contains(h));
    let mv = Command::StartMigration {
        table: TABLE,
        tablet: first.id,
        leaving: Some(first.replicas[0]),
        pending: elsewhere,
    };
    assert_eq!(
        state.apply(mv),
        CommandOutcome::Rejected("the tablet is being split or merged".into())
    );

    let plan_number = state.tables[&TABLE].strong_splits[&first.id].plan;
    // Another plan's finish (one abandoned since) is refused.
    let stale = Command::FinishStrongSplit {
        table: TABLE,
        tablet: first.id,
        plan: plan_number + 1,
        clock: 1234,
    };
    assert!(matches!(state.apply(stale), CommandOutcome::Rejected(_)));
    let finish = Command::FinishStrongSplit {
        table: TABLE,
        tablet: first.id,
        plan: plan_number,
        clock: 1234,
    };
    assert_eq!(state.apply(finish.clone()), CommandOutcome::Applied);
    assert!(state.topology_version > version);
    let placement = state.tables[&TABLE].clone();
    let halves = &placement.tablets.tablets()[..2];
    assert_eq!(halves[0].last_token, at);
    assert!(halves.iter().all(|t| t.replicas == first.replicas));
    assert!(halves
        .iter()
        .all(|t| placement.clock_floors.get(&t.id) == Some(&1234)));
    assert!(placement.strong_splits.is_empty());
    // Only one end per plan: finishing again, or abandoning now, is refused.
    assert!(matches!(state.apply(finish), CommandOutcome::Rejected(_)));
    let abandon = |plan| Command::AbandonStrongSplit {
        table: TABLE,
        tablet: halves[0].id,
        plan,
    };
    assert!(matches!(
        state.apply(abandon(plan_number)),
        CommandOutcome::Rejected(_)
    ));

    // Abandoned: the tablet stays whole and may be planned again.
    let half = halves[0].clone();
    let plan = Command::PlanStrongSplit {
        table: TABLE,
        tablet: half.id,
        at: Token(half.last_token.0 - 10),
    };
    assert_eq!(state.apply(plan.clone()), CommandOutcome::Applied);
    let second_plan = state.tables[&TABLE].strong_splits[&half.id].plan;
    assert_ne!(second_plan, plan_number, "every plan has its own number");
    assert_eq!(state.apply(abandon(second_plan)), CommandOutcome::Applied);
    assert!(state.tables[&TABLE].strong_splits.is_empty());
    assert_eq!(state.apply(plan), CommandOutcome::Applied);
}

#[test]
fn neighbouring_tablets_marked_and_merged_become_one_with_the_same_replicas() {
    let mut state = three_nodes_one_table(3);
    let tablets = state.tables[&TABLE].tablets.tablets().to_vec();
    let (first, second) = (tablets[0].clone(), tablets[1].clone());
    let plan = Command::PlanTabletMerge {
        table: TABLE,
        first: first.id,
    };
    // Never below the tablets a table is created with.
    assert!(matches!(
        state.apply(plan.clone()),
        CommandOutcome::Rejected(_)
    ));
    let last = tablets.last().unwrap();
    let split = Command::SplitTablet {
        table: TABLE,
        tablet: last.id,
        at: Token(last.last_token.0 - 1000),
    };
    assert_eq!(state.apply(split), CommandOutcome::Applied);
    let version = state.topology_version;
    assert_eq!(state.apply(plan.clone()), CommandOutcome::Applied);
    assert_eq!(state.topology_version, version, "no routing changed");
    assert!(matches!(state.apply(plan), CommandOutcome::Rejected(_)));
    let merge = Command::MergeTablets {
        table: TABLE,
        first: first.id,
        second: second.id,
    };
    assert_eq!(state.apply(merge.clone()), CommandOutcome::Applied);
    assert!(state.topology_version > version, "routing changed");
    let merged = &state.tables[&TABLE].tablets.tablets()[0];
    assert_eq!(merged.last_token, second.last_token);
    assert_eq!(merged.replicas, first.replicas);
    assert_eq!(state.tables[&TABLE].tablets.tablets().len(), tablets.len());
    // Applied once: the same merge again names tablets that are gone.
    assert!(matches!(state.apply(merge), CommandOutcome::Rejected(_)));
    // Back at the tablets it was created with: no more merges.
    let merged = state.tables[&TABLE].tablets.tablets()[0].id;
    assert!(matches!(
        state.apply(Command::PlanTabletMerge {
            table: TABLE,
            first: merged
        }),
        CommandOutcome::Rejected(_)
    ));
}

#[test]
fn a_strong_merge_fences_both_tablets_and_ends_once_with_the_newer_clock() {
    let mut state = three_nodes_one_table(3);
    let tablets = state.tables[&TABLE].tablets.tablets().to_vec();
    let (first, second) = (tablets[0].clone(), tablets[1].clone());
    let last = tablets.last().unwrap();
    state.apply(Command::SplitTablet {
        table: TABLE,
        tablet: last.id,
        at: Token(last.last_token.0 - 1000),
    });
    let plan = Command::PlanStrongMerge {
        table: TABLE,
        first: first.id,
    };
    // Only a pair marked to merge.
    assert!(matches!(
        state.apply(plan.clone()),
        CommandOutcome::Rejected(_)
    ));
    state.apply(Command::PlanTabletMerge {
        table: TABLE,
        first: first.id,
    });
    assert_eq!(state.apply(plan.clone()), CommandOutcome::Applied);
    let placement = &state.tables[&TABLE];
    let number = placement.strong_merges[&first.id];
    // Both groups are fenced for it; the third tablet is not.
    assert_eq!(placement.strong_plan_of(first.id), Some(number));
    assert_eq!(placement.strong_plan_of(second.id), Some(number));
    assert_eq!(placement.strong_plan_of(tablets[2].id), None);
    assert!(matches!(state.apply(plan), CommandOutcome::Rejected(_)));

    let abandon = Command::AbandonStrongMerge {
        table: TABLE,
        first: first.id,
        plan: number,
    };
    assert_eq!(state.apply(abandon.clone()), CommandOutcome::Applied);
    assert!(matches!(state.apply(abandon), CommandOutcome::Rejected(_)));
    state.apply(Command::PlanStrongMerge {
        table: TABLE,
        first: first.id,
    });
    let number = state.tables[&TABLE].strong_merges[&first.id];
    let finish = Command::FinishStrongMerge {
        table: TABLE,
        first: first.id,
        plan: number,
        clock: 77,
    };
    assert_eq!(state.apply(finish.clone()), CommandOutcome::Applied);
    let placement = &state.tables[&TABLE];
    let merged = &placement.tablets.tablets()[0];
    assert_eq!(merged.last_token, second.last_token);
    assert_eq!(placement.clock_floors.get(&merged.id), Some(&77));
    assert!(placement.strong_merges.is_empty());
    assert!(matches!(state.apply(finish), CommandOutcome::Rejected(_)));
}

#[test]
fn a_table_merges_down_to_the_tablets_it_was_created_with_not_to_todays_layout() {
    let mut state = three_nodes_one_table(1);
    let created_with = state.tables[&TABLE].tablets.tablets().len();
    assert_eq!(state.merge_floor(&TABLE), Some(created_with));
    // A fourth node would give a new table more tablets; this one's floor stays.
    state.apply(Command::AddMember(member(4)));
    assert_eq!(state.merge_floor(&TABLE), Some(created_with));
    let last = state.tables[&TABLE]
        .tablets
        .tablets()
        .last()
        .unwrap()
        .clone();
    let split = Command::SplitTablet {
        table: TABLE,
        tablet: last.id,
        at: Token(last.last_token.0 - 1000),
    };
    assert_eq!(state.apply(split), CommandOutcome::Applied);
    let first = state.tables[&TABLE].tablets.tablets()[0].id;
    let plan = Command::PlanTabletMerge {
        table: TABLE,
        first,
    };
    assert_eq!(state.apply(plan), CommandOutcome::Applied);
    assert_eq!(state.merge_floor(&TableId([0xee; 16])), None);
}

#[test]
fn existing_tables_keep_their_tablets_when_members_join_and_replication_changes() {
    let mut state = three_nodes_one_table(2);
    let before = state.tables[&TABLE].tablets.clone();
    assert_eq!(before.tablets().len(), 3 * TABLETS_PER_NODE);
    assert_eq!(
        state.apply(Command::AddMember(joining(4))),
        CommandOutcome::Applied
    );
    assert_eq!(state.tables[&TABLE].tablets, before);
    state.apply(Command::ChangeSchema {
        base_version: Some([1; 16]),
        schema: schema(2),
        tables: BTreeMap::from([(TABLE, ReplicationStrategy::Simple { factor: 3 })]),
    });
    assert_eq!(state.tables[&TABLE].tablets, before);
    assert_eq!(
        state.tables[&TABLE].strategy,
        ReplicationStrategy::Simple { factor: 3 }
    );
    // A table created now is placed over the four nodes, and each node reports the
    // tokens of the tablets it is first replica of there.
    state.apply(Command::ChangeSchema {
        base_version: Some([2; 16]),
        schema: schema(3),
        tables: BTreeMap::from([
            (TABLE, ReplicationStrategy::Simple { factor: 3 }),
            (TableId([8; 16]), ReplicationStrategy::Simple { factor: 1 }),
        ]),
    });
    let new_table = &state.tables[&TableId([8; 16])].tablets;
    assert_eq!(new_table.tablets().len(), 4 * TABLETS_PER_NODE);
    for id in 1..=4u8 {
        let tokens = state.tokens_of(&HostId([id; 16]), |_| true);
        assert_eq!(tokens.len(), TABLETS_PER_NODE);
        for token in tokens {
            assert_eq!(new_table.tablet_for(token).replicas[0], HostId([id; 16]));
        }
    }
}

#[test]
fn a_migration_walks_its_stages_and_switches_replicas_at_cleanup() {
    let mut state = three_nodes_one_table(2);
    state.apply(Command::AddMember(joining(4)));
    let old = tablet(&state, 0).replicas.clone();
    let leaving = old[1];
    let version = state.topology_version;
    let start = Command::StartMigration {
        table: TABLE,
        tablet: TabletId(0),
        leaving: Some(leaving),
        pending: Some(HostId([4; 16])),
    };
    assert_eq!(state.apply(start.clone()), CommandOutcome::Applied);
    assert_eq!(state.topology_version, version + 1);
    let migration = tablet(&state, 0).transition.as_ref().unwrap().id;
    assert!(matches!(state.apply(start), CommandOutcome::Rejected(_)));
    for to in [
        MigrationStage::WriteBoth,
        MigrationStage::Streamed,
        MigrationStage::ReadNew,
        MigrationStage::Cleanup,
    ] {
        assert_eq!(tablet(&state, 0).replicas, old, "switched before {to:?}");
        assert_eq!(
            state.apply(Command::AdvanceMigration {
                table: TABLE,
                tablet: TabletId(0),
                migration,
                to,
            }),
            CommandOutcome::Applied
        );
    }
    assert_eq!(tablet(&state, 0).replicas, vec![old[0], HostId([4; 16])]);
    let end = |aborted| Command::EndMigration {
        table: TABLE,
        tablet: TabletId(0),
        migration,
        aborted,
    };
    assert!(matches!(
        state.apply(end(true)),
        CommandOutcome::Rejected(_)
    ));
    assert_eq!(state.apply(end(false)), CommandOutcome::Applied);
    assert!(tablet(&state, 0).transition.is_none());
    assert_eq!(state.next_migration, migration.0 + 1);
}

#[test]
fn migration_steps_check_their_preconditions() {
    let mut state = three_nodes_one_table(2);
    let replicas = tablet(&state, 0).replicas.clone();
    let outsider = [1u8, 2, 3]
        .map(|id| HostId([id; 16]))
        .into_iter()
        .find(|h| !replicas.contains(h))
        .unwrap();
    let start = |leaving, pending| Command::StartMigration {
        table: TABLE,
        tablet: TabletId(0),
        leaving,
        pending,
    };
    let refused = |outcome: CommandOutcome| matches!(outcome, CommandOutcome::Rejected(_));
    assert!(refused(
        state.apply(start(Some(outsider), Some(replicas[0])))
    ));
    assert!(refused(
        state.apply(start(Some(replicas[0]), Some(replicas[1])))
    ));
    assert!(refused(state.apply(start(None, None))));
    assert!(refused(state.apply(start(None, Some(HostId([7; 16]))))));
    // A leaving member cannot receive replicas.
    state.apply(Command::SetMemberState {
        host_id: outsider,
        from: vec![MemberState::Normal],
        to: MemberState::Leaving,
    });
    assert!(refused(
        state.apply(start(Some(replicas[0]), Some(outsider)))
    ));
    // Stages advance one at a time, for the migration under way only.
    state.apply(Command::SetMemberState {
        host_id: outsider,
        from: vec![MemberState::Leaving],
        to: MemberState::Normal,
    });
    assert_eq!(
        state.apply(start(Some(replicas[0]), Some(outsider))),
        CommandOutcome::Applied
    );
    let migration = tablet(&state, 0).transition.as_ref().unwrap().id;
    let advance = |migration, to| Command::AdvanceMigration {
        table: TABLE,
        tablet: TabletId(0),
        migration,
        to,
    };
    assert!(refused(
        state.apply(advance(migration, MigrationStage::ReadNew))
    ));
    assert!(refused(
        state.apply(advance(MigrationId(99), MigrationStage::WriteBoth))
    ));
    // Aborted before the switch, the old replicas stay.
    state.apply(advance(migration, MigrationStage::WriteBoth));
    // Reads cannot move before writes have waited for the new replicas (`Streamed`).
    assert!(refused(
        state.apply(advance(migration, MigrationStage::ReadNew))
    ));
    assert_eq!(
        state.apply(Command::EndMigration {
            table: TABLE,
            tablet: TabletId(0),
            migration,
            aborted: true,
        }),
        CommandOutcome::Applied
    );
    assert_eq!(tablet(&state, 0).replicas, replicas);
    assert!(tablet(&state, 0).transition.is_none());
}

#[test]
fn dropping_a_replica_skips_streaming_and_a_member_leaves_only_when_it_holds_nothing() {
    let mut state = three_nodes_one_table(1);
    let holder = tablet(&state, 0).replicas[0];
    assert!(matches!(
        state.apply(Command::RemoveMember(holder)),
        CommandOutcome::Rejected(_)
    ));
    state.apply(Command::SetMemberState {
        host_id: holder,
        from: vec![MemberState::Normal],
        to: MemberState::Leaving,
    });
    assert!(matches!(
        state.apply(Command::RemoveMember(holder)),
        CommandOutcome::Rejected(_)
    ));
    // Give every tablet of the leaving member away by dropping (factor 1 here is only
    // for the test: the balancer moves rather than drops when the factor needs it).
    let held: Vec<TabletId> = state.tables[&TABLE]
        .tablets
        .tablets()
        .iter()
        .filter(|t| t.replicas.contains(&holder))
        .map(|t| t.id)
        .collect();
    let other = [1u8, 2, 3]
        .map(|id| HostId([id; 16]))
        .into_iter()
        .find(|h| *h != holder)
        .unwrap();
    for id in held {
        state.apply(Command::StartMigration {
            table: TABLE,
            tablet: id,
            leaving: Some(holder),
            pending: Some(other),
        });
        let migration = state.tables[&TABLE]
            .tablets
            .get(id)
            .unwrap()
            .transition
            .as_ref()
            .unwrap()
            .id;
        for to in [
            MigrationStage::WriteBoth,
            MigrationStage::Streamed,
            MigrationStage::ReadNew,
            MigrationStage::Cleanup,
        ] {
            state.apply(Command::AdvanceMigration {
                table: TABLE,
                tablet: id,
                migration,
                to,
            });
        }
        state.apply(Command::EndMigration {
            table: TABLE,
            tablet: id,
            migration,
            aborted: false,
        });
    }
    assert_eq!(
        state.apply(Command::RemoveMember(holder)),
        CommandOutcome::Applied
    );
    assert!(state.member_by_host(&holder).is_none());
    // A drop (no pending replica) starts at ReadNew.
    let replicas = tablet(&state, 1).replicas.clone();
    state.apply(Command::StartMigration {
        table: TABLE,
        tablet: TabletId(1),
        leaving: Some(replicas[0]),
        pending: None,
    });
    assert_eq!(
        tablet(&state, 1).transition.as_ref().unwrap().stage,
        MigrationStage::ReadNew
    );
    assert!(tablet(&state, 1).read_replicas().is_empty());
}

#[test]
fn a_replacing_member_marks_the_replaced_one_removing() {
    let mut state = three_nodes_one_table(3);
    let mut replacement = member(9);
    replacement.state = MemberState::Joining;
    replacement.replaces = Some(HostId([2; 16]));
    assert_eq!(
        state.apply(Command::AddMember(replacement)),
        CommandOutcome::Applied
    );
    assert_eq!(
        state.member_by_host(&HostId([2; 16])).unwrap().state,
        MemberState::Removing
    );
    let mut bogus = member(10);
    bogus.replaces = Some(HostId([42; 16]));
    assert!(matches!(
        state.apply(Command::AddMember(bogus)),
        CommandOutcome::Rejected(_)
    ));
}

#[test]
fn dropped_tables_leave_the_placement() {
    let mut state = ClusterState::default();
    state.apply(Command::AddMember(member(1)));
    state.apply(Command::ChangeSchema {
        base_version: None,
        schema: schema(1),
        tables: BTreeMap::from([(TableId([9; 16]), ReplicationStrategy::Simple { factor: 1 })]),
    });
    state.apply(Command::ChangeSchema {
        base_version: Some([1; 16]),
        schema: schema(2),
        tables: BTreeMap::new(),
    });
    assert!(state.replicas(&TableId([9; 16]), Token(0)).is_none());
}
