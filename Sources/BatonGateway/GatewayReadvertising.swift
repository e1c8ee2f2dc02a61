// The loop's re-advertising part (docs/relay.md §9): other rooms' activities put on this
// room's air through the kernel's advertising interface, and the phones' links to them.
import BatonLibc
import BatonCore
import BatonHCI
import BatonKeys
import BatonMQTT
import BatonRelay
import BatonWire
import CLibc

struct GatewayReadvertising {
    let radio: any AdvertisingController
    /// Which activities are on the air; nil without the keyed group's key and tagger.
    var readvertiser: Readvertiser?
    let tagger: BeaconTagger?
    /// The beacons' company id (`beacon.company-id`): what the slots' advertisements carry.
    let companyID: UInt16
    var errors = 0
    let log: Logger

    /// The readvertiser's and the phones' links' part of the stats topic (docs/relay.md §9).
    func writeStats(continuing: borrowing ContinuingLinks, into w: inout JSONWriter) throws(WireError) {
        guard let readvertiser else { return }
        try w.key("readvertise"); try w.beginObject()
        try w.key("capacity"); try w.int(Int64(readvertiser.slots.count))
        try w.key("on_air"); try w.beginArray()
        for a in readvertiser.slots {
            guard let a else { continue }
            try w.string(Topics.deviceText(a.device))
        }
        try w.endArray()
        try w.key("errors"); try w.int(Int64(errors))
        try continuing.writeStats(into: &w)
        try w.key("drops"); try w.beginObject()
        for d in readvertiser.drops.sorted { try w.key(d.reason); try w.int(Int64(d.count)) }
        try continuing.writeDrops(into: &w)
        try w.endObject()
        try w.endObject()
    }
}

/// The phones' listeners, one per slot in slot order, then the management socket the
/// kernel answers on; the deadline is the oldest unanswered request's.
extension GatewayReadvertising: LoopPart {
    mutating func pollDescriptors(into fds: inout [pollfd]) {
        for fd in radio.listenerFDs { fds.append(pollfd(fd: fd, events: Int16(POLLIN), revents: 0)) }
        fds.append(pollfd(fd: radio.eventFD, events: Int16(POLLIN), revents: 0))
    }
    /// A listener per advertising slot, and the management socket.
    var descriptorLimit: Int { radio.listenerFDs.count + 1 }

    var nextDeadline: Instant? { radio.answerDeadline }
}

extension GatewayReadvertising {
    /// The part's work: phones connecting, the kernel's answers (read when they are there and
    /// failed at their deadline: nothing in the loop waits for the kernel), and removals by
    /// another program.
    mutating func serve(_ ready: ArraySlice<pollfd>, due: Bool, now: Instant, continuing: inout ContinuingLinks) {
        acceptPhones(ready.dropLast(), now: now, continuing: &continuing)
        if ready.last.map({ $0.revents != 0 }) ?? false || due || radio.removalsPending {
            answers(now: now)
            removed()
        }
    }


    /// Puts a slot on the air or takes it off. The kernel's refusal is logged and counted; the
    /// slot is tried again at the activity's next change.
    mutating func changed(_ change: Readvertiser.Change) {
        guard let onAir = readvertiser, let tagger else { return }
        do throws(ManagementError) {
            switch change {
            case .advertise(let k):
                let data = onAir.advertisement(k, companyID: companyID, tagger: tagger)
                guard !data.isEmpty else { return }  // the slot left the air meanwhile
                try radio.advertise(k, data)
                if let a = onAir.slots[k] {
                    log.info("re-advertising \(Topics.deviceText(a.device)) seq \(a.sequence) from gateway \(a.owner) on PSM 0x\(Hex.text(UInt64(onAir.psms[k]), digits: 4))")
                }
            case .withdraw(let k):
                try radio.withdraw(k)
                log.debug("re-advertising slot \(k) ends")
            }
        } catch {
            errors &+= 1
            log.warning("re-advertising on \(radio.adapter): \(error)")
            // Not on the air: the slot is free again, and the activity's next message tries again.
            // The remove that goes first may have failed too: make sure the old one is gone.
            if case .advertise(let k) = change {
                do throws(ManagementError) { try radio.withdraw(k) } catch {}
                readvertiser?.forget(k)
            }
        }
    }

    /// The kernel refused a request, or did not answer it by its deadline: counted and logged
    /// as a refusal inside `changed(_:)` is; an advertisement that did not go on the
    /// air frees its slot, and the activity's next message tries again.
    mutating func answers(now: Instant) {
        var failed: [(slot: Int, advertise: Bool, error: ManagementError)] = []
        radio.answers(now: now) { failed.append((slot: $0, advertise: $1, error: $2)) }
        for f in failed {
            errors &+= 1
            log.warning("re-advertising on \(radio.adapter): \(f.error.description)")
            guard f.advertise, readvertiser?.slots[f.slot] != nil else { continue }
            do throws(ManagementError) { try radio.withdraw(f.slot) } catch {}
            readvertiser?.forget(f.slot)
        }
    }

    /// Someone else removed slots' advertisements (bluetoothd resets every instance when it
    /// starts or the adapter comes back): they go on the air again.
    mutating func removed() {
        var removed: [Int] = []
        radio.removedSlots { removed.append($0) }
        for k in removed where readvertiser?.slots[k] != nil {
            log.info("re-advertising slot \(k) was removed by another program (bluetoothd?): putting it back")
            changed(.advertise(k))
        }
    }

    /// Phones connecting to the slots' PSMs (`fds`: one per listener, in slot order).
    mutating func acceptPhones(_ fds: ArraySlice<pollfd>, now: Instant, continuing: inout ContinuingLinks) {
        for (k, fd) in zip(radio.psms.indices, fds) where fd.revents != 0 {
            let accepted: (fd: Int32, peer: LinkAddress)?
            do throws(LinkError) { accepted = try radio.accept(k) } catch {
                errors &+= 1
                log.warning("accepting a phone's link on \(radio.adapter): \(error)")
                continue
            }
            guard let accepted else { continue }
            let channel = LinkChannel(accepted: accepted.fd, peer: accepted.peer, l2cap: radio.acceptsL2CAP)
            guard let device = readvertiser?.slots[k]?.device else {
                // The activity left the air between the phone's scan and its connect.
                var c = channel
                c.close()
                continuing.refusedGone()
                continue
            }
            log.debug("phone \(accepted.peer) continues \(Topics.deviceText(device))")
            continuing.adopt(channel, device: device, now: now)
        }
    }

    /// What happened elsewhere that changes what is on the air: an owner went offline (its
    /// activities are nobody's to continue now), the retained scan ended, an activity message.
    mutating func ownerOffline(_ id: Substring) {
        var gone: [Readvertiser.Change] = []
        readvertiser?.ownerOffline(id) { gone.append($0) }
        for change in gone { changed(change) }
    }

    mutating func retainedScanEnded() {
        var ended: [Readvertiser.Change] = []
        readvertiser?.retainedScanEnded { ended.append($0) }
        for change in ended { changed(change) }
    }

    mutating func activity(device: UInt64, payload: [UInt8], isOnline: (String) -> Bool) {
        if let change = readvertiser?.activity(device: device, payload: payload, isOnline: isOnline) { changed(change) }
    }
}

extension ContinuingLinks {
    /// An owner's answer to a fetch asked for a phone.
    mutating func answered(_ message: MQTTMessage, link: UInt64?, now: Instant) {
        let a = AnswerForPhone(message)
        answered(link: link, correlation: a.correlation, status: a.status, sequence: a.sequence, payload: a.payload, now: now)
    }
}
