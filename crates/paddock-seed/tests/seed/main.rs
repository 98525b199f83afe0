//! Seed images checked by independent readers: pycdlib (and `blkid`, `xorriso` where installed).

mod reader;

use paddock_seed::{agent_seed_iso, iso_image, nocloud_iso, seed_iso, Dir, SeedError, MAX_TOTAL_BYTES, MIN_SEED_BYTES};

const META_DATA: &[u8] = b"instance-id: machine-0f3c\nlocal-hostname: node-1\n";
const USER_DATA: &[u8] = b"#cloud-config\nruncmd:\n  - [sh, -c, 'echo hello']\n";
const NETWORK_CONFIG: &[u8] = b"version: 2\nethernets:\n  eno1:\n    dhcp4: true\n";

fn owned(files: &[(&str, &[u8])]) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = files.iter().map(|(n, d)| ((*n).to_owned(), d.to_vec())).collect();
    files.sort();
    files
}

#[test]
fn seed_image_reads_back_by_real_names_through_joliet() {
    let image = seed_iso(META_DATA, USER_DATA, Some(NETWORK_CONFIG)).expect("seed image");
    assert_eq!(image.len() % 2048, 0);
    let Some(seen) = reader::read_with_pycdlib("joliet", &image) else { return };
    assert_eq!(seen.report["pvd_volume_id"], "cidata");
    assert_eq!(seen.report["has_joliet"], true);
    assert_eq!(seen.report["joliet_volume_id"], "cidata");
    let expected = [("meta-data", META_DATA), ("user-data", USER_DATA), ("network-config", NETWORK_CONFIG)];
    assert_eq!(seen.files("joliet"), owned(&expected));
    // The primary tree holds the same files under level-1 names.
    let mangled = [("META_DAT.;1", META_DATA), ("USER_DAT.;1", USER_DATA), ("NETWORK_.;1", NETWORK_CONFIG)];
    assert_eq!(seen.files("iso9660"), owned(&mangled));
    assert_eq!(seen.warnings, "", "pycdlib warned");
}

const AGENT_JSON: &[u8] = br#"{"agent_url":"https://paddock.example:8443","agent_token":"dG9rZW4","ca_cert":null}"#;

#[test]
fn agent_seed_holds_paddock_agent_json_beside_nocloud_and_fills_a_floppy() {
    let image = agent_seed_iso(META_DATA, USER_DATA, AGENT_JSON).expect("agent seed");
    assert_eq!(image.len(), MIN_SEED_BYTES, "small contents are padded to exactly one floppy");
    assert_eq!(image.len() % 2048, 0);
    let Some(seen) = reader::read_with_pycdlib("agent-seed", &image) else { return };
    assert_eq!(seen.report["pvd_volume_id"], "cidata");
    assert_eq!(seen.report["joliet_volume_id"], "cidata");
    assert_eq!(seen.report["volume_bytes"], MIN_SEED_BYTES, "the volume size counts the padding");
    let expected = [("meta-data", META_DATA), ("user-data", USER_DATA), ("paddock/agent.json", AGENT_JSON)];
    assert_eq!(seen.files("joliet"), owned(&expected));
    let mangled = [("META_DAT.;1", META_DATA), ("USER_DAT.;1", USER_DATA), ("PADDOCK/AGENT.JSO;1", AGENT_JSON)];
    assert_eq!(seen.files("iso9660"), owned(&mangled));
    assert_eq!(seen.warnings, "", "pycdlib warned");
}

#[test]
fn the_simulators_reader_finds_what_pycdlib_finds() {
    let image = agent_seed_iso(META_DATA, USER_DATA, AGENT_JSON).expect("agent seed");
    assert_eq!(paddock_seed::read_file(&image, "paddock/agent.json").as_deref(), Some(AGENT_JSON));
    assert_eq!(paddock_seed::read_file(&image, "meta-data").as_deref(), Some(META_DATA));
    assert_eq!(paddock_seed::read_file(&image, "paddock"), None, "a directory is no file");
    assert_eq!(paddock_seed::read_file(&image, "paddock/nothing"), None);
    assert_eq!(paddock_seed::read_file(b"not an image", "meta-data"), None);
}

#[test]
fn a_large_agent_seed_is_not_cut_to_the_floppy_size() {
    let big = vec![b'x'; MIN_SEED_BYTES];
    let image = agent_seed_iso(META_DATA, &big, AGENT_JSON).expect("agent seed");
    assert!(image.len() > MIN_SEED_BYTES);
    let Some(seen) = reader::read_with_pycdlib("agent-seed-big", &image) else { return };
    assert_eq!(seen.files("joliet")[2], ("user-data".to_owned(), big));
}

#[test]
fn several_directories_read_back_through_both_readers() {
    let a: [(&str, &[u8]); 2] = [("one.txt", b"1"), ("two", b"")];
    let b: [(&str, &[u8]); 1] = [("three", b"333")];
    let dirs = [Dir { name: "zeta", files: &a }, Dir { name: "alpha-dir", files: &b }];
    let image = iso_image(&[("top", b"t")], &dirs, "cidata", 0).expect("image");
    let expected = [("top", &b"t"[..]), ("zeta/one.txt", b"1"), ("zeta/two", b""), ("alpha-dir/three", b"333")];
    if let Some(seen) = reader::read_with_pycdlib("dirs", &image) {
        assert_eq!(seen.files("joliet"), owned(&expected));
        assert_eq!(seen.warnings, "", "pycdlib warned");
    }
    if let Some((_, files)) = reader::xorriso_extract("dirs", &image) {
        assert_eq!(files, owned(&expected));
    }
    let err = iso_image(&[("zeta", b"")], &dirs, "cidata", 0).expect_err("a file and a directory of one name");
    assert!(matches!(err, SeedError::DuplicateName { .. }), "{err}");
}

#[test]
fn blkid_reports_the_agent_seed_as_an_iso9660_volume_labelled_cidata() {
    let image = agent_seed_iso(META_DATA, USER_DATA, AGENT_JSON).expect("agent seed");
    let Some(export) = reader::blkid("blkid-agent", &image) else { return };
    assert!(export.lines().any(|l| l == "LABEL=cidata"), "blkid said: {export}");
    assert!(export.lines().any(|l| l == "TYPE=iso9660"), "blkid said: {export}");
}

#[test]
fn seed_image_without_network_config_has_exactly_two_files() {
    let image = seed_iso(META_DATA, USER_DATA, None).expect("seed image");
    let Some(seen) = reader::read_with_pycdlib("two-files", &image) else { return };
    assert_eq!(seen.files("joliet"), owned(&[("meta-data", META_DATA), ("user-data", USER_DATA)]));
}

#[test]
fn empty_user_data_reads_back_empty() {
    let image = seed_iso(META_DATA, b"", None).expect("seed image");
    assert_eq!(image.len() % 2048, 0);
    let Some(seen) = reader::read_with_pycdlib("empty", &image) else { return };
    assert_eq!(seen.files("joliet"), owned(&[("meta-data", META_DATA), ("user-data", b"")]));
}

#[test]
fn many_files_and_multi_sector_contents_read_back() {
    // 30 names of 60 characters need two directory sectors in the Joliet tree (153-byte records),
    // and the large file spans several sectors without ending on a boundary.
    let names: Vec<String> = (0..30).map(|i| format!("{i:02}-{}", "x".repeat(57))).collect();
    let contents: Vec<Vec<u8>> = (0..30u32).map(|i| (0..i * 700 + 1).map(|b| (b * 7 + i) as u8).collect()).collect();
    let files: Vec<(&str, &[u8])> = names.iter().map(String::as_str).zip(contents.iter().map(Vec::as_slice)).collect();
    let image = nocloud_iso(&files, "cidata").expect("image");
    assert_eq!(image.len() % 2048, 0);
    let Some(seen) = reader::read_with_pycdlib("many", &image) else { return };
    assert_eq!(seen.files("joliet"), owned(&files));
    // Mangled names collide ("00_XXXXX" for all) and are made unique, so all 30 remain readable.
    let primary = seen.files("iso9660");
    assert_eq!(primary.len(), 30);
    let mut primary_contents: Vec<Vec<u8>> = primary.into_iter().map(|(_, d)| d).collect();
    let mut expected_contents = contents.clone();
    primary_contents.sort();
    expected_contents.sort();
    assert_eq!(primary_contents, expected_contents);
}

#[test]
fn directories_are_sized_in_the_order_their_records_are_written() {
    // Names of varying lengths given in reverse order: sorted, the records pack into the sectors
    // differently than given, so a directory sized in input order could come out a sector short.
    let names: Vec<String> =
        (0..40).rev().map(|i| format!("{i:02}-{}", "y".repeat(if i % 2 == 0 { 58 } else { 3 }))).collect();
    let files: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &b"z"[..])).collect();
    let image = iso_image(&[], &[Dir { name: "d", files: &files }], "cidata", 0).expect("image");
    let Some(seen) = reader::read_with_pycdlib("order", &image) else { return };
    let expected: Vec<(String, &[u8])> = names.iter().map(|n| (format!("d/{n}"), &b"z"[..])).collect();
    let expected: Vec<(&str, &[u8])> = expected.iter().map(|(n, d)| (n.as_str(), *d)).collect();
    assert_eq!(seen.files("joliet"), owned(&expected));
}

#[test]
fn same_input_gives_same_bytes() {
    let a = seed_iso(META_DATA, USER_DATA, Some(NETWORK_CONFIG)).expect("seed image");
    let b = seed_iso(META_DATA, USER_DATA, Some(NETWORK_CONFIG)).expect("seed image");
    assert_eq!(a, b);
    let c = seed_iso(META_DATA, b"#cloud-config\n", Some(NETWORK_CONFIG)).expect("seed image");
    assert_ne!(a, c);
}

#[test]
fn primary_volume_descriptor_fields_are_both_endian_and_consistent() {
    let image = seed_iso(META_DATA, USER_DATA, None).expect("seed image");
    let pvd = &image[16 * 2048..17 * 2048];
    assert_eq!(&pvd[..7], b"\x01CD001\x01");
    assert_eq!(&pvd[40..72], format!("{:<32}", "cidata").as_bytes());
    let sectors = (image.len() / 2048) as u32;
    assert_eq!(pvd[80..84], sectors.to_le_bytes());
    assert_eq!(pvd[84..88], sectors.to_be_bytes());
    let svd = &image[17 * 2048..18 * 2048];
    assert_eq!(&svd[..7], b"\x02CD001\x01");
    assert_eq!(&svd[88..91], b"%/E");
    assert_eq!(&image[18 * 2048..18 * 2048 + 7], b"\xffCD001\x01");
    assert!(image[..16 * 2048].iter().all(|&b| b == 0), "system area is zero");
}

#[test]
fn blkid_reports_an_iso9660_volume_labelled_cidata() {
    let image = seed_iso(META_DATA, USER_DATA, None).expect("seed image");
    let Some(export) = reader::blkid("blkid", &image) else { return };
    assert!(export.lines().any(|l| l == "LABEL=cidata"), "blkid said: {export}");
    assert!(export.lines().any(|l| l == "TYPE=iso9660"), "blkid said: {export}");
}

#[test]
fn bad_names_are_rejected() {
    let long = "a".repeat(65);
    for name in ["", "a/b", "dätä", long.as_str(), "a;1", "a\nb", "a*", ".", ".."] {
        let err = nocloud_iso(&[(name, b"x")], "cidata").expect_err(name);
        assert!(matches!(err, SeedError::InvalidName { .. }), "{name:?}: {err}");
    }
    let max = "a".repeat(64);
    nocloud_iso(&[(max.as_str(), b"x")], "cidata").expect("64-character name");
    let err = nocloud_iso(&[("user-data", b"x"), ("user-data", b"y")], "cidata").expect_err("duplicate");
    assert!(matches!(err, SeedError::DuplicateName { .. }), "{err}");
}

#[test]
fn bad_labels_are_rejected() {
    for label in ["", "ci data", "cidata/", "seventeen-chars-x", "çidata"] {
        let err = nocloud_iso(&[("meta-data", b"")], label).expect_err(label);
        assert!(matches!(err, SeedError::InvalidLabel { .. }), "{label:?}: {err}");
    }
}

#[test]
fn oversize_input_is_rejected() {
    let half = vec![0u8; MAX_TOTAL_BYTES / 2];
    let err = seed_iso(&half, &half, Some(b"x")).expect_err("one byte over the limit");
    assert!(matches!(err, SeedError::TooLarge { total, .. } if total == MAX_TOTAL_BYTES + 1), "{err}");
    let image = seed_iso(&half, &half, None).expect("exactly at the limit");
    assert_eq!(image.len() % 2048, 0);
}

#[test]
fn xorriso_extracts_the_joliet_tree_by_real_names() {
    let image = seed_iso(META_DATA, b"", Some(NETWORK_CONFIG)).expect("seed image");
    let Some((volume_id, files)) = reader::xorriso_extract("xorriso", &image) else { return };
    assert_eq!(volume_id, "cidata");
    let expected = [("meta-data", META_DATA), ("user-data", &b""[..]), ("network-config", NETWORK_CONFIG)];
    assert_eq!(files, owned(&expected));
}
