import BatonLibc
import ArgumentParser
import BatonMQTT
import BatonRelay
import Foundation
import Glibc

/// `baton watch`: the current activities per room as a live table (docs/mqtt.md §6), what a
/// person would otherwise do with `mosquitto_sub -v` and squinting.
struct WatchCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Show the current activities per room, live, from the broker.")

    @OptionGroup var options: BrokerOptions
    @Flag(name: .long, help: "Print the table once the broker's retained state has arrived, then exit.")
    var once = false
    @Flag(name: .long, help: "One line per change instead of a redrawn table (the default when not on a terminal).")
    var lines = false

    func run() throws {
        var client = try options.client(id: "baton-watch-\(getpid())", reconnectMax: .seconds(5))
        let topics = Topics(prefix: options.prefix), broker = options.broker
        var view = WatchView(topics: topics, redraw: !lines && !once && isatty(STDOUT_FILENO) == 1)
        client.start(now: .now)
        var lastMessage = Instant.now
        var connectedAt: Instant?
        let giveUp = Instant.now + .seconds(10)
        while true {
            var fd = pollfd(fd: client.socket, events: Int16(POLLIN), revents: 0)
            if client.wantsWrite { fd.events |= Int16(POLLOUT) }
            _ = Glibc.poll(&fd, 1, 200)
            let now = Instant.now
            var events: [MQTTEvent] = []
            client.poll(now: now, readable: fd.revents & Int16(POLLIN | POLLHUP | POLLERR) != 0,
                        writable: fd.revents & Int16(POLLOUT) != 0) { events.append($0) }
            for event in events {
                switch event {
                case .connected:
                    // What was cleared while we were away never arrives: start from the
                    // retained state the broker sends now.
                    view.reset()
                    connectedAt = now
                    lastMessage = now
                    do throws(MQTTError) {
                        try client.subscribe(topics.activityPattern, qos: 1)
                        try client.subscribe(topics.statusPattern, qos: 1)
                        // Was-continued events (docs/relay.md §3): not retained, news only.
                        try client.subscribe(topics.continuedPattern, qos: 1)
                        // The people: devices named by their IRK (docs/security.md §10).
                        try client.subscribe(topics.applePattern, qos: 1)
                    } catch {
                        throw ValidationError("subscribe: \(error)")
                    }
                case .refused(let reason), .disconnected(let reason):
                    Stderr.say("watch", "\(reason)")
                case .message(let m):
                    lastMessage = now
                    view.take(m)
                }
            }
            if once {
                // Retained messages arrive right after the subscription; half a second of
                // quiet means they are all here.
                if let c = connectedAt, now - lastMessage > .milliseconds(500), now - c > .milliseconds(500) {
                    print(view.table(), terminator: "")
                    return
                }
                if connectedAt == nil, now > giveUp {
                    throw ValidationError("could not connect to \(broker) within 10 s")
                }
            }
            view.flush()
        }
    }
}

/// What the watcher knows: activities by device, gateways by id.
struct WatchView {
    struct Activity {
        var room: String; var gateway: String; var type: String; var seq: Int; var state: String; var changed: String
        /// The type's name and the title, when the gateway knows them (docs/mqtt.md §2).
        var typeName: String? = nil
        var title: String? = nil
        /// What to show: `"A long read" (com.example.reader.article)`, the type, or its hash.
        var what: String {
            let kind = typeName ?? type
            return title.map { "\"\($0)\" (\(kind))" } ?? kind
        }
    }
    let topics: Topics
    let redraw: Bool
    var activities: [String: Activity] = [:]
    /// Named devices (`apple.irks`) by id: where each person's phone or watch is.
    var people: [String: (name: String, room: String, gateway: String)] = [:]
    var gateways: [String: String] = [:]
    var dirty = false

    init(topics: Topics, redraw: Bool) { self.topics = topics; self.redraw = redraw }

    mutating func take(_ m: MQTTMessage) {
        switch topics.classify(m.topic) {
        case .activity(let id):
            let device = Topics.deviceText(id)
            if m.payload.isEmpty {
                if activities.removeValue(forKey: device) != nil { changed("\(device) cleared") }
                return
            }
            guard let o = try? JSONSerialization.jsonObject(with: Data(m.payload)) as? [String: Any] else { return }
            let a = Activity(room: o["room"] as? String ?? "?", gateway: o["gateway"] as? String ?? "?",
                             type: o["type_hash"] as? String ?? "?", seq: o["seq"] as? Int ?? 0,
                             state: o["change"] as? String ?? "?", changed: o["changed"] as? String ?? "",
                             typeName: o["type"] as? String, title: o["title"] as? String)
            let before = activities.updateValue(a, forKey: device)
            // Another gateway publishing the same activity: the person walked into its room
            // (docs/rooms.md §1).
            if let before, before.gateway != a.gateway, before.seq == a.seq, before.type == a.type {
                changed("\(device) moved to \(a.room) from \(before.room) (gateway \(a.gateway), seq \(a.seq), \(a.what))")
            } else if let before, before.gateway == a.gateway, before.seq == a.seq, before.title != a.title || before.typeName != a.typeName {
                // The gateway learnt the title from the payload (docs/relay.md §4.1).
                changed("\(device) is \(a.what) (seq \(a.seq))")
            } else {
                changed("\(device) \(a.state) in \(a.room) (gateway \(a.gateway), seq \(a.seq), \(a.what))")
            }
        case .apple(let appleID):
            let id = Topics.appleText(appleID)
            if m.payload.isEmpty {
                if let gone = people.removeValue(forKey: id) { changed("\(gone.name) left \(gone.room)") }
                return
            }
            // Only named devices: the others are pseudonyms per gateway (docs/mqtt.md §3).
            guard let o = try? JSONSerialization.jsonObject(with: Data(m.payload)) as? [String: Any],
                  o["resolved"] as? Bool == true, let name = o["name"] as? String else { return }
            let now = (name: name, room: o["room"] as? String ?? "?", gateway: o["gateway"] as? String ?? "?")
            let before = people.updateValue(now, forKey: id)
            if let before, before.room != now.room {
                changed("\(name) moved to \(now.room) from \(before.room)")
            } else if before == nil {
                changed("\(name) in \(now.room)")
            }
        case .continued(let device):
            guard let o = try? JSONSerialization.jsonObject(with: Data(m.payload)) as? [String: Any] else { return }
            let at = o["at"] as? String ?? "?", room = o["room"] as? String ?? "?"
            changed("\(Topics.deviceText(device)) continued at \(at) (from \(room), seq \(o["seq"] as? Int ?? 0))")
        case .status(let gateway):
            gateways[String(gateway)] = String(decoding: m.payload, as: UTF8.self)
            changed("gateway \(gateway) \(gateways[String(gateway)]!)")
        default:
            break
        }
    }

    mutating func reset() {
        activities.removeAll()
        people.removeAll()
        gateways.removeAll()
        dirty = true
    }

    mutating func changed(_ line: String) {
        if redraw {
            dirty = true
        } else {
            let stamp = String(Date().description.dropFirst(11).prefix(8))
            print("\(stamp) \(line)")
            fflush(nil)
        }
    }

    mutating func flush() {
        guard redraw, dirty else { return }
        dirty = false
        print("\u{1B}[H\u{1B}[2J" + table(), terminator: "")
        fflush(nil)
    }

    func table() -> String {
        var out = "ROOM            DEVICE        ACTIVITY                                 SEQ    STATE            GATEWAY\n"
        let sorted = activities.sorted { ($0.value.room, $0.key) < ($1.value.room, $1.key) }
        for (device, a) in sorted {
            out += pad(a.room, 15) + " " + pad(device, 13) + " " + pad(String(a.what.prefix(40)), 40) + " " + pad(String(a.seq), 6) + " "
                + pad(a.state, 16) + " " + a.gateway + " (" + (gateways[a.gateway] ?? "?") + ")\n"
        }
        if !people.isEmpty {
            out += "ROOM            PERSON'S DEVICE\n"
            for (_, p) in people.sorted(by: { ($0.value.room, $0.value.name) < ($1.value.room, $1.value.name) }) {
                out += pad(p.room, 15) + " " + p.name + "\n"
            }
        }
        out += "\(activities.count) activities; gateways: "
        out += gateways.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ") + "\n"
        return out
    }

    func pad(_ s: String, _ n: Int) -> String { s.count >= n ? s : s + String(repeating: " ", count: n - s.count) }
}
