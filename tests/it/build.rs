//! Building a runtime: setup errors are typed and name the remedy.

use mailring::{BuildError, FaultInjection};

fn build_with(faults: FaultInjection) -> Result<mailring::Runtime, BuildError> {
    mailring::Runtime::builder()
        .shards(2)
        .fault_injection(faults)
        .build()
}

#[test]
fn sysctl_disabled_is_reported() {
    let dir = std::env::temp_dir().join(format!("mailring-sysctl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("io_uring_disabled");
    std::fs::write(&path, "2\n").unwrap();
    let mut faults = FaultInjection::default();
    faults.sysctl_path = Some(path);
    let err = build_with(faults).unwrap_err();
    assert!(matches!(err, BuildError::Disabled { value: 2 }), "{err:?}");
    assert!(err.to_string().contains("io_uring_disabled"), "{err}");
}

#[test]
fn seccomp_eperm_is_reported() {
    let mut faults = FaultInjection::default();
    faults.setup_errno = Some(libc_eperm());
    let err = build_with(faults).unwrap_err();
    assert!(matches!(err, BuildError::PermissionDenied), "{err:?}");
    assert!(err.to_string().contains("seccomp"), "{err}");
}

#[test]
fn enosys_is_reported() {
    let mut faults = FaultInjection::default();
    faults.setup_errno = Some(38); // ENOSYS
    let err = build_with(faults).unwrap_err();
    assert!(matches!(err, BuildError::Unsupported), "{err:?}");
}

#[test]
fn missing_msg_ring_is_reported() {
    let mut faults = FaultInjection::default();
    faults.hide_opcode = Some(40); // IORING_OP_MSG_RING
    let err = build_with(faults).unwrap_err();
    match err {
        BuildError::MissingOpcode { opcode, .. } => assert_eq!(opcode, "MSG_RING"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn bad_configuration_is_rejected() {
    assert!(matches!(
        mailring::Runtime::builder().shards(0).build(),
        Err(BuildError::Config(_))
    ));
    assert!(matches!(
        mailring::Runtime::builder()
            .shards(mailring::MAX_SHARDS + 1)
            .build(),
        Err(BuildError::Config(_))
    ));
}

#[test]
fn stats_record_accepted_ring_flags() {
    let rt = crate::rt2();
    let stats = rt.stats();
    assert_eq!(stats.shards.len(), 2);
    for s in &stats.shards {
        // This kernel (6.18) accepts the full set; older ones fall back flag by flag.
        assert!(
            s.ring.single_issuer && s.ring.defer_taskrun && s.ring.coop_taskrun,
            "{s:?}"
        );
        assert!(s.ring.cq_entries >= 4 * s.ring.sq_entries, "{s:?}");
    }
}

fn libc_eperm() -> i32 {
    1
}
