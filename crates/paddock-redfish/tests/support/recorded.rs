//! TEST-ONLY replay of a real BMC's `#Drive.SecureErase` flow, for what the emulator cannot do:
//! sushy-tools has no `Drive.SecureErase` at all, so no test against it can see a BMC perform
//! one. NOT a live BMC and not a capture of one session: the answers below are those of OpenBMC's
//! bmcweb, the Redfish server of OpenBMC BMCs, as its public source writes them:
//!
//! - the drive's action with its `@Redfish.ActionInfo`, and that ActionInfo (`SanitizationType`
//!   allowing `Overwrite`, `BlockErase`, `CryptographicErase`; `OverwritePasses`): bmcweb's
//!   `redfish-core/lib/storage.hpp` as the NVIDIA fork carries it (github.com/NVIDIA/bmcweb:
//!   `handleDriveSanitizetActionInfoGet`, and `handleDriveSanitizePost`, which refuses a POST
//!   without `SanitizationType`), route `.../Drives/{id}/SanitizeActionInfo`;
//! - the task: bmcweb's `redfish-core/include/task.hpp` (github.com/openbmc/bmcweb) (`TaskData::populateResp`): the
//!   action is answered `202 Accepted` with `Location: /redfish/v1/TaskService/Tasks/{n}/Monitor`
//!   and the Task (`#Task.v1_4_3.Task`, `TaskState`, `TaskStatus`) as body; the monitor answers
//!   the same `202` while the task runs and then, once, `204 No Content` however it ended; how it
//!   ended is the Task resource's `TaskState` and `Messages` (`TaskEvent.1.0.TaskCompletedOK`,
//!   `TaskEvent.1.0.TaskAborted`). The `Retry-After: 30` bmcweb adds is left out, so that a test
//!   does not wait 30 s per poll.
//!
//! DMTF's public mockups (Redfish-Mockup-Server `public-rackmount1`) have a Task
//! (`TaskService/Tasks/545`) but no drive with `#Drive.SecureErase`, so they cannot be replayed
//! for this.

use reqwest::Method;
use serde_json::{json, Value};

use super::proxy::{Fault, FaultProxy, Rule};

/// The Task id and its monitor, as bmcweb numbers its first task.
pub const TASK: &str = "/redfish/v1/TaskService/Tasks/0";
pub const MONITOR: &str = "/redfish/v1/TaskService/Tasks/0/Monitor";

/// How the replayed erase task ends.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// `Completed`/`OK` with `TaskCompletedOK`.
    Completed,
    /// `Exception`/`Critical` with `TaskAborted`.
    Aborted,
}

/// The message bmcweb records on the Task when it ends this way.
pub fn final_message(ending: Ending) -> &'static str {
    match ending {
        Ending::Completed => "The task with Id '0' has completed.",
        Ending::Aborted => "The task with Id '0' has been aborted.",
    }
}

/// Makes `drive` (the end of its path, e.g. `/Storage/1/Drives/nvme0`) advertise bmcweb's
/// `#Drive.SecureErase` with its ActionInfo, and answers the erase as bmcweb does: `202` with a
/// task monitor that reports `Running` `polls` times, then `204`, the Task ending as `ending`.
pub fn replay_secure_erase(proxy: &FaultProxy, drive: &str, polls: usize, ending: Ending) {
    let info = format!("{drive}/SanitizeActionInfo");
    // Before the drive's rule: the drive's path is a prefix of the ActionInfo's.
    proxy.rule(Rule::containing(Some(Method::GET), &info, replay(200, None, action_info(&info))));
    proxy.rule(Rule::containing(
        Some(Method::GET),
        drive,
        Fault::Rewrite(std::sync::Arc::new(|v: &mut Value| {
            let id = v["@odata.id"].as_str().unwrap_or_default().trim_end_matches('/').to_owned();
            v["Actions"]["#Drive.SecureErase"] = json!({
                "target": format!("{id}/Actions/Drive.SecureErase"),
                "@Redfish.ActionInfo": format!("{id}/SanitizeActionInfo"),
            });
        })),
    ));
    let running = task("Running", "OK", None);
    proxy.rule(Rule::containing(
        Some(Method::POST),
        &format!("{drive}/Actions/Drive.SecureErase"),
        replay(202, Some(MONITOR), running.clone()),
    ));
    if polls > 0 {
        proxy.rule(Rule::exact(Some(Method::GET), MONITOR, replay(202, Some(MONITOR), running)).times(polls));
    }
    proxy.rule(Rule::exact(Some(Method::GET), MONITOR, replay(204, None, Value::Null)).times(1));
    let ended = match ending {
        Ending::Completed => task("Completed", "OK", Some(("TaskCompletedOK", "OK", final_message(ending)))),
        Ending::Aborted => task("Exception", "Critical", Some(("TaskAborted", "Critical", final_message(ending)))),
    };
    proxy.rule(Rule::exact(Some(Method::GET), TASK, replay(200, None, ended)));
}

fn replay(status: u16, location: Option<&str>, body: Value) -> Fault {
    Fault::Replay { status, location: location.map(str::to_owned), body }
}

/// bmcweb's ActionInfo of a drive whose sanitize capabilities are all three.
fn action_info(id: &str) -> Value {
    json!({
        "@odata.type": "#ActionInfo.v1_1_2.ActionInfo",
        "@odata.id": id,
        "Name": "Sanitize Action Info",
        "Id": "SanitizeActionInfo",
        "Parameters": [
            { "Name": "OverwritePasses", "DataType": "integer" },
            {
                "Name": "SanitizationType",
                "DataType": "string",
                "AllowableValues": ["Overwrite", "BlockErase", "CryptographicErase"],
            },
        ],
    })
}

/// bmcweb's Task 0, with its one message when it has ended.
fn task(state: &str, status: &str, message: Option<(&str, &str, &str)>) -> Value {
    let mut task = json!({
        "@odata.id": TASK,
        "@odata.type": "#Task.v1_4_3.Task",
        "Id": "0",
        "TaskState": state,
        "TaskStatus": status,
    });
    if let Some((id, severity, text)) = message {
        task["Name"] = json!("Task 0");
        task["TaskMonitor"] = json!(MONITOR);
        task["PercentComplete"] = json!(100);
        task["Messages"] = json!([{
            "@odata.type": "#Message.v1_1_1.Message",
            "MessageId": format!("TaskEvent.1.0.{id}"),
            "Message": text,
            "MessageArgs": ["0"],
            "MessageSeverity": severity,
            "Resolution": "None.",
        }]);
    }
    task
}
