//! Virtual media: the devices, found through the links only, and their inserts and ejects.

use std::time::Instant;

use reqwest::Method;
use serde_json::json;
use tracing::{debug, info, instrument, warn};
use url::Url;

use crate::error::RedfishError;
use crate::model::{
    media_class, ChangeOutcome, Collection, ManagerRes, MediaClass, SystemRes, SystemUuid, VirtualMediaDevice,
    VirtualMediaRes,
};
use crate::redact::Redactor;
use crate::transport::Sending;

use super::{gap, last_segment, RedfishClient};

/// A virtual media device as read, with where it lives and its `ETag`.
pub(super) struct DeviceRead {
    path: String,
    res: VirtualMediaRes,
    etag: Option<String>,
}

impl DeviceRead {
    /// The device's `Id` (the last segment of its URI when it reports none).
    pub(super) fn id(&self) -> String {
        self.res.id.clone().unwrap_or_else(|| last_segment(&self.path).to_owned())
    }

    /// Whether the device holds (or names) an image.
    fn is_loaded(&self) -> bool {
        self.res.inserted == Some(true) || self.res.image.is_some()
    }

    /// Whether the device shows `image` inserted.
    fn holds(&self, image: &str) -> bool {
        self.res.inserted == Some(true) && self.res.image.as_deref() == Some(image)
    }
}

impl RedfishClient {
    /// Lists the virtual media devices, found under the system or else under its managers
    /// (`Links.ManagedBy`). Empty when the BMC has none.
    #[instrument(skip_all, fields(bmc.host = %self.host_key()))]
    pub async fn virtual_media_devices(&self) -> Result<Vec<VirtualMediaDevice>, RedfishError> {
        let _slot = self.operation().await;
        let system = self.read_system().await?;
        let devices = self.devices(&system.res).await?;
        Ok(devices
            .into_iter()
            .map(|d| VirtualMediaDevice {
                id: d.id(),
                name: d.res.name,
                media_types: d.res.media_types,
                inserted: d.res.inserted,
                image: d.res.image,
            })
            .collect())
    }

    /// Inserts `image_url` into virtual media `device` (by `Id`, e.g. `Cd`). Already inserted is
    /// success; another image is ejected first (many BMCs refuse an insert over media). Checks the
    /// UUID first.
    ///
    /// Many BMCs fetch the whole image inside the insert's request, so it gets its own timeout
    /// (`RedfishConfig::insert_timeout`) and is never sent again once it may have reached the
    /// BMC: an insert left unanswered is followed by a read of the device, and until the device
    /// shows the image, or the insert timeout has passed once more, every call answers
    /// `InsertUnconfirmed` instead of sending it again.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected, media.device = device))]
    pub async fn insert_media(
        &self,
        expected: &SystemUuid,
        device: &str,
        image_url: &Url,
    ) -> Result<ChangeOutcome, RedfishError> {
        let _slot = self.operation().await;
        let system = self.guarded_system(expected).await?;
        let found = self.device(&system.res, device).await?;
        let image = image_url.as_str();
        if found.holds(image) {
            self.unanswered.forget(&found.path);
            return Ok(ChangeOutcome::AlreadyDone);
        }
        let found = if found.is_loaded() {
            info!("ejecting the previous image from {device} first");
            self.eject(&found).await?;
            self.reread(&found).await?
        } else {
            found
        };
        self.insert_into(&found, image, None).await?;
        info!("inserted media into {device}");
        Ok(ChangeOutcome::Applied)
    }

    /// Ejects whatever is in virtual media `device`. Already empty is success. Checks the UUID first.
    #[instrument(skip_all, fields(bmc.host = %self.host_key(), system.uuid = %expected, media.device = device))]
    pub async fn eject_media(&self, expected: &SystemUuid, device: &str) -> Result<ChangeOutcome, RedfishError> {
        let _slot = self.operation().await;
        let system = self.guarded_system(expected).await?;
        let found = self.device(&system.res, device).await?;
        if !found.is_loaded() {
            return Ok(ChangeOutcome::AlreadyDone);
        }
        self.eject(&found).await?;
        info!("ejected media from {device}");
        Ok(ChangeOutcome::Applied)
    }

    /// The devices for a media boot: a CD for the image and a second usable device for the seed
    /// (another CD first, then a USB stick or removable disk, then a floppy).
    pub(super) async fn media_plan(&self, system: &SystemRes) -> Result<(DeviceRead, DeviceRead), RedfishError> {
        let devices = self.devices(system).await?;
        let mut usable: Vec<(MediaClass, DeviceRead)> = devices
            .into_iter()
            .map(|d| (media_class(&d.res.media_types), d))
            .filter(|(class, _)| *class != MediaClass::Unsuitable)
            .collect();
        if usable.len() < 2 {
            return Err(RedfishError::NoSecondVirtualMedia { usable: usable.iter().map(|(_, d)| d.id()).collect() });
        }
        let Some(cd) = usable.iter().position(|(class, _)| *class == MediaClass::Cd) else {
            let ids: Vec<String> = usable.iter().map(|(_, d)| d.id()).collect();
            return Err(gap(&format!("a CD/DVD virtual media device for the image (devices: {})", ids.join(", "))));
        };
        let (_, cd) = usable.remove(cd);
        // Stable: among equals, the BMC's order.
        usable.sort_by_key(|(class, _)| *class);
        let (_, second) = usable.remove(0);
        Ok((cd, second))
    }

    /// Ejects every loaded device.
    pub(super) async fn eject_all(&self, system: &SystemRes) -> Result<ChangeOutcome, RedfishError> {
        self.eject_all_but_landed(system, None).await
    }

    /// Ejects every loaded device but `keep` (a device and the image about to be inserted into
    /// it) when it shows that image from an unanswered insert: that insert landed after all, and
    /// ejecting it would only make the BMC fetch the image once more.
    pub(super) async fn eject_all_but_landed(
        &self,
        system: &SystemRes,
        keep: Option<(&DeviceRead, &str)>,
    ) -> Result<ChangeOutcome, RedfishError> {
        let mut outcome = ChangeOutcome::AlreadyDone;
        for device in self.devices(system).await? {
            let landed = keep.is_some_and(|(keep, image)| {
                device.path == keep.path && device.holds(image) && self.unanswered.since(&device.path, image).is_some()
            });
            if landed {
                info!(media.device = %device.id(), "keeping the media an unanswered insert put in");
            } else if device.is_loaded() {
                self.eject(&device).await?;
                info!(media.device = %device.id(), "ejected media");
                outcome = ChangeOutcome::Applied;
            }
        }
        Ok(outcome)
    }

    /// Inserts `image` (`InsertMedia`, or a PATCH of `Image` on a BMC without the action) and
    /// checks that the device shows media. With `redact`, the BMC's answers are scrubbed of it.
    /// The insert is sent once, with the insert timeout: when it gets no answer, the device's
    /// state says whether it landed, and an unanswered insert is not sent again before the
    /// insert timeout has passed since (see [`insert_media`](Self::insert_media)).
    pub(super) async fn insert_into(
        &self,
        found: &DeviceRead,
        image: &str,
        redact: Option<&Redactor>,
    ) -> Result<(), RedfishError> {
        let device = found.id();
        if found.holds(image) {
            // Already there (an earlier, unanswered insert of it landed): nothing to fetch again.
            self.unanswered.forget(&found.path);
            return Ok(());
        }
        if let Some(since) = self.unanswered.since(&found.path, image) {
            let waited = since.elapsed();
            if waited < self.insert_timeout {
                return Err(RedfishError::InsertUnconfirmed { device, waited, source: None });
            }
            // As long again as the insert could take, and still nothing: taken as lost.
            info!(media.device = %device, "an unanswered insert into {device} did not land; sending it again");
            self.unanswered.forget(&found.path);
        }
        let action = found.res.actions.as_ref().and_then(|a| a.insert.as_ref()).and_then(|a| a.target.clone());
        let body = json!({ "Image": image, "Inserted": true, "WriteProtected": true });
        let (method, link, if_match, what) = match &action {
            Some(action) => (Method::POST, action.as_str(), None, format!("VirtualMedia.InsertMedia on {device}")),
            None => (Method::PATCH, found.path.as_str(), found.etag.as_deref(), format!("PATCH of Image on {device}")),
        };
        let sending = Sending::Once(self.insert_timeout);
        match self.transport.change_sent(method, link, &body, if_match, &what, sending, redact).await {
            Ok(()) => {}
            Err(e) if e.may_have_reached_the_bmc() => return self.confirm_unanswered(found, image, e).await,
            Err(e) => return Err(e),
        }
        let after: VirtualMediaRes = self.transport.get(&found.path).await?;
        if after.inserted == Some(false) || (after.inserted.is_none() && after.image.is_none()) {
            return Err(RedfishError::NotApplied { what: format!("insert of media into {device}") });
        }
        debug!(media.device = %device, "inserted media");
        Ok(())
    }

    /// After an insert that got no answer: reads the device instead of sending the insert again.
    /// Shown there, it landed; else it is recorded as unanswered, and the BMC may still be
    /// fetching the image.
    async fn confirm_unanswered(
        &self,
        found: &DeviceRead,
        image: &str,
        error: RedfishError,
    ) -> Result<(), RedfishError> {
        let device = found.id();
        let since = Instant::now();
        let now = self.reread(found).await?;
        if now.holds(image) {
            info!(media.device = %device, "the insert into {device} got no answer, but landed");
            return Ok(());
        }
        self.unanswered.record(&found.path, image, since);
        let waited = since.elapsed();
        warn!(media.device = %device, "the insert into {device} got no answer; not sending it again before it can have landed");
        Err(RedfishError::InsertUnconfirmed { device, waited, source: Some(Box::new(error)) })
    }

    /// Ejects (`EjectMedia`, or a PATCH of `Image`/`Inserted` on a BMC without the action) and
    /// checks that the device shows no media.
    async fn eject(&self, found: &DeviceRead) -> Result<(), RedfishError> {
        let device = found.id();
        let action = found.res.actions.as_ref().and_then(|a| a.eject.as_ref()).and_then(|a| a.target.clone());
        match &action {
            Some(action) => {
                let what = format!("VirtualMedia.EjectMedia on {device}");
                self.transport.change(Method::POST, action, &json!({}), None, &what).await?;
            }
            None => {
                let what = format!("PATCH of Image on {device}");
                let body = json!({ "Image": null, "Inserted": false });
                self.transport.change(Method::PATCH, &found.path, &body, found.etag.as_deref(), &what).await?;
            }
        }
        let after: VirtualMediaRes = self.transport.get(&found.path).await?;
        if after.inserted == Some(true) {
            return Err(RedfishError::NotApplied { what: format!("eject of media from {device}") });
        }
        Ok(())
    }

    /// The device read again (fresh state and `ETag`).
    pub(super) async fn reread(&self, found: &DeviceRead) -> Result<DeviceRead, RedfishError> {
        let (res, etag) = self.transport.get_tagged::<VirtualMediaRes>(&found.path).await?;
        Ok(DeviceRead { path: found.path.clone(), res, etag })
    }

    /// The virtual media collection: the system's own, else the first manager that has one.
    async fn media_collection(&self, system: &SystemRes) -> Result<Option<String>, RedfishError> {
        if let Some(link) = &system.virtual_media {
            return Ok(Some(link.id.clone()));
        }
        let managers = system.links.as_ref().map(|l| l.managed_by.as_slice()).unwrap_or_default();
        for manager in managers {
            let res: ManagerRes = self.transport.get(&manager.id).await?;
            if let Some(link) = res.virtual_media {
                return Ok(Some(link.id));
            }
        }
        Ok(None)
    }

    /// The paths of the virtual media devices (the collection's members), read once per machine
    /// (see [`Discovery`]); `None` when the BMC has no virtual media.
    async fn media_members(&self, system: &SystemRes) -> Result<Option<Vec<String>>, RedfishError> {
        if let Some(known) = self.media_members.lock().ok().and_then(|m| m.clone()) {
            return Ok(Some(known));
        }
        let Some(collection) = self.media_collection(system).await? else {
            return Ok(None);
        };
        let members: Vec<String> =
            self.transport.get::<Collection>(&collection).await?.members.into_iter().map(|m| m.id).collect();
        if let Ok(mut known) = self.media_members.lock() {
            *known = Some(members.clone());
        }
        Ok(Some(members))
    }

    async fn devices(&self, system: &SystemRes) -> Result<Vec<DeviceRead>, RedfishError> {
        let Some(members) = self.media_members(system).await? else {
            return Ok(Vec::new());
        };
        let mut devices = Vec::with_capacity(members.len());
        for path in members {
            let (res, etag) = self.transport.get_tagged::<VirtualMediaRes>(&path).await?;
            devices.push(DeviceRead { path, res, etag });
        }
        Ok(devices)
    }

    /// The device with `Id` `device` (case-insensitive), read through the links.
    async fn device(&self, system: &SystemRes, device: &str) -> Result<DeviceRead, RedfishError> {
        let Some(members) = self.media_members(system).await? else {
            return Err(gap("virtual media"));
        };
        // The member whose URI ends with the Id is almost always it; read the others only if not.
        let mut ordered: Vec<&String> =
            members.iter().filter(|m| last_segment(m).eq_ignore_ascii_case(device)).collect();
        ordered.extend(members.iter().filter(|m| !last_segment(m).eq_ignore_ascii_case(device)));
        for member in ordered {
            let (res, etag) = self.transport.get_tagged::<VirtualMediaRes>(member).await?;
            let id = res.id.clone().unwrap_or_else(|| last_segment(member).to_owned());
            if id.eq_ignore_ascii_case(device) {
                return Ok(DeviceRead { path: member.clone(), res, etag });
            }
        }
        Err(RedfishError::NoSuchVirtualMedia {
            device: device.to_owned(),
            available: members.iter().map(|m| last_segment(m).to_owned()).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_classes_rank_the_seed_carriers() {
        let class = |v: &[&str]| media_class(&v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(class(&["CD", "DVD"]), MediaClass::Cd);
        assert_eq!(class(&["Floppy", "USBStick"]), MediaClass::Removable);
        assert_eq!(class(&["Floppy"]), MediaClass::Floppy);
        assert_eq!(class(&[]), MediaClass::Unknown);
        assert_eq!(class(&["Tape"]), MediaClass::Unsuitable);
        assert!(MediaClass::Cd < MediaClass::Removable && MediaClass::Floppy < MediaClass::Unknown);
    }
}
