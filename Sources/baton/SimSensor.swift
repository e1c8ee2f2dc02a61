// `baton sim sensor`: a connectable thermometer on a real controller (docs/esphome.md §11,
// docs/simulator.md "A sensor to connect to"): the simulator's GATT database
// (`GATTServerModel.thermometer`) served on the controller's ATT channel, so Home Assistant's
// connections through a gateway can be tried against the kernel's own stack (the VM test does).
// It does not advertise: `btmgmt add-adv -c` (or bluetoothctl) makes it connectable.
import ArgumentParser
import BatonLibc
import BatonRelay
import BatonSim
import Glibc

extension Sim {
    struct Sensor: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Serve a thermometer's GATT database on a real controller's ATT channel.",
            discussion: """
                Centrals that connect to the adapter (advertise it connectable: btmgmt add-adv -c) find a \
                Battery service (level 87 %) and a service with a 40-byte writable value and a temperature; \
                once a central turns the temperature's notifications on (its descriptor, handle 10), it is \
                notified every --interval seconds, 0.01 °C warmer each time. Needs the adapter's ATT channel \
                to itself: bluetoothd listens there.
                """)

        @Option(help: "The adapter (hciN or its address).")
        var adapter = "hci1"

        @Option(help: "Seconds between temperature notifications while they are on.")
        var interval: Double = 2

        @Option(help: "Stop after this many seconds (0: run until stopped).")
        var seconds: Double = 0

        func validate() throws {
            guard interval > 0, seconds >= 0 else { throw ValidationError("--interval must be above 0, --seconds at least 0") }
        }

        func run() throws {
            let listener: L2CAPListener
            do throws(LinkError) { listener = try L2CAPListener(attributesOn: adapter) } catch {
                Stderr.say("sim sensor", "\(error)")
                throw ExitCode(1)
            }
            Stderr.say("sim sensor", "serving a thermometer's GATT database on \(adapter)'s ATT channel")
            struct Central { var fd: Int32; var peer: LinkAddress; var model: GATTServerModel; var due: Instant? }
            var centrals: [Central] = []
            let end = seconds > 0 ? Instant.now + .milliseconds(Int64(seconds * 1000)) : nil
            let every = Duration.milliseconds(Int64(interval * 1000))
            var buffer = [UInt8](repeating: 0, count: 1024)
            while end.map({ Instant.now < $0 }) ?? true {
                var fds = [pollfd(fd: listener.fd, events: Int16(POLLIN), revents: 0)]
                for c in centrals { fds.append(pollfd(fd: c.fd, events: Int16(POLLIN), revents: 0)) }
                _ = Glibc.poll(&fds, nfds_t(fds.count), 200)
                if fds[0].revents != 0 {
                    while let (fd, peer) = try? listener.accept() {
                        Stderr.say("sim sensor", "\(peer.deviceName) connected")
                        centrals.append(Central(fd: fd, peer: peer, model: .thermometer(), due: nil))
                    }
                }
                var k = 0
                while k < centrals.count {
                    let n = buffer.withUnsafeMutableBytes { recv(centrals[k].fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
                    if n == 0 || (n < 0 && Glibc.errno != EAGAIN) {
                        Stderr.say("sim sensor", "a central disconnected")
                        close(centrals[k].fd)
                        centrals.remove(at: k)
                        continue
                    }
                    if n > 0, let answer = centrals[k].model.answer(Array(buffer[..<n])) {
                        send(centrals[k].fd, answer)
                    }
                    if n > 0 { continue }  // read until EAGAIN
                    // Notifications (01 00) or indications (02 00) on: every interval.
                    let cccd = centrals[k].model.value(GATTServerModel.temperatureCCCD) ?? [0, 0]
                    if cccd[0] & 0x03 != 0 {
                        let now = Instant.now
                        if centrals[k].due == nil { centrals[k].due = now }
                        if let due = centrals[k].due, now >= due {
                            let t = centrals[k].model.value(GATTServerModel.temperature) ?? [0, 0]
                            let next = (UInt16(t[0]) | UInt16(t[1]) << 8) &+ 1
                            let pdu = centrals[k].model.notification(GATTServerModel.temperature, [UInt8(next & 0xFF), UInt8(next >> 8)],
                                                                     indicate: cccd[0] & 0x01 == 0)
                            send(centrals[k].fd, pdu)
                            centrals[k].due = due + every
                        }
                    } else {
                        centrals[k].due = nil
                    }
                    k += 1
                }
            }
            for c in centrals { close(c.fd) }
        }

        func send(_ fd: Int32, _ pdu: [UInt8]) {
            _ = pdu.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        }
    }
}
