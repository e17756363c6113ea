//! Which of a bench's groups and reports to run, from its command line
//! (`cargo bench --bench NAME -- FILTER`), shared by the benches.

/// A predicate on group names: true for every group without a filter, else
/// for the groups whose name contains the filter or starts it (so
/// `W1_table/queue/1` selects the group `W1_table`). The filter is the last
/// bare argument: an earlier one may be an option's value, as in
/// `--profile-time 5 W1_table/queue/1`.
pub fn wanted() -> impl Fn(&str) -> bool {
    let filter = std::env::args().skip(1).rfind(|a| !a.starts_with('-'));
    move |group: &str| filter.as_deref().is_none_or(|f| group.contains(f) || f.starts_with(group))
}

/// Whether the command line asks for the short version (`--quick`).
#[allow(dead_code)] // Not every bench has a report with a short version.
pub fn quick() -> bool {
    std::env::args().any(|a| a == "--quick")
}

/// A named Criterion group of a bench.
pub type Group<'a> = (&'a str, fn(&mut criterion::Criterion));

/// A named plain report of a bench (it prints its own figures).
pub type Report<'a> = (&'a str, fn());

/// A bench's `main`: runs its wanted Criterion groups, Criterion's summary,
/// then its wanted plain reports (which print their own figures, so they
/// come after the summary rather than inside it).
pub fn run(groups: &[Group], reports: &[Report]) {
    let wanted = wanted();
    let mut c = criterion::Criterion::default().configure_from_args();
    for (name, group) in groups {
        if wanted(name) {
            group(&mut c);
        }
    }
    c.final_summary();
    for (name, report) in reports {
        if wanted(name) {
            report();
        }
    }
}
