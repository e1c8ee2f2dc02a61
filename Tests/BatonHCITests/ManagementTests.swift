// BlueZ's management interface as bytes (BlueZ doc/mgmt-api.txt: "Packet Structures", the
// Read Controller Information, Set Powered, Read Advertising Features, Add Advertising and
// Remove Advertising commands, Command Complete / Command Status events, Error Codes). The
// Add Advertising vector is what btmon showed `baton device` sending in the VM (docs/vm.md):
// "MGMT Command: Add Advertising (0x003e) plen 42".

import Glibc
import Testing
import BatonTestSupport
import CBlueZ
import BatonWire
@testable import BatonHCI

/// The packet an encoder writes, as "04 00 01 00 00 00", checked against its guard byte.
private func written(_ capacity: Int = 128,
                     _ encode: (inout ByteWriter) throws(WireError) -> Void) throws -> String {
    var storage = [UInt8](repeating: 0xEE, count: capacity + 1)
    let n = try storage.withUnsafeMutableBytes { raw throws in
        var w = ByteWriter(UnsafeMutableRawBufferPointer(rebasing: raw[..<capacity]))
        try encode(&w)
        return w.count
    }
    #expect(storage[capacity] == 0xEE, "wrote past the writer's capacity")
    return spacedHex(storage[..<n])
}

private func event(_ hex: String) throws -> ManagementEvent {
    try hx(hex).withUnsafeBytes { try ManagementEvent.parse($0) }
}

private func eventError(_ hex: String) -> WireError? {
    do { _ = try event(hex); return nil } catch { return error as? WireError }
}

/// Docs/protocol.md §2.5 vector 1: the 31-byte advertisement of an open-group beacon.
private let vector1 = "02 01 06 1B FF FF FF 01 03 02 01 B7 4B 9B BE D4 C3 B2 A1 9A 78 56 34 12 5A 80 00 00 00 00 00"

@Suite("Management interface (BlueZ doc/mgmt-api.txt)")
struct ManagementTests {
    @Test("Commands as bytes: opcode, controller index, parameter length, parameters, all little-endian")
    func commandsAsBytes() throws {
        #expect(try written { w throws(WireError) in try ManagementCommand.readControllerInformation(index: 1, into: &w) }
            == "04 00 01 00 00 00")
        #expect(try written { w throws(WireError) in try ManagementCommand.setPowered(index: 0, true, into: &w) }
            == "05 00 00 00 01 00 01")
        #expect(try written { w throws(WireError) in try ManagementCommand.setPowered(index: 0x0102, false, into: &w) }
            == "05 00 02 01 01 00 00")
        #expect(try written { w throws(WireError) in try ManagementCommand.readAdvertisingFeatures(index: 1, into: &w) }
            == "3D 00 01 00 00 00")
        #expect(try written { w throws(WireError) in try ManagementCommand.removeAdvertising(index: 1, instance: 5, into: &w) }
            == "3F 00 01 00 01 00 05")
    }

    @Test("Add Advertising: instance, flags (connectable), duration and timeout 0, the beacon as Adv_Data")
    func addAdvertisingAsBytes() throws {
        let data = hx(vector1)
        let hex = try data.withUnsafeBytes { d in
            try written { w throws(WireError) in
                try ManagementCommand.addAdvertising(index: 1, instance: 5, flags: .connectable, advertisingData: d, into: &w)
            }
        }
        // plen 42 = 11 fixed + 31 data, as btmon printed it for `baton device` in the VM.
        #expect(hex == "3E 00 01 00 2A 00 05 01 00 00 00 00 00 00 00 1F 00 " + vector1)
        // And with a scan response and the discoverable bit, the lengths and flags follow.
        let scan = hx("03 09 41 42")
        let both = try data.withUnsafeBytes { d in
            try scan.withUnsafeBytes { s in
                try written { w throws(WireError) in
                    try ManagementCommand.addAdvertising(index: 0, instance: 1, flags: [.connectable, .generalDiscoverable],
                                                         duration: 2, timeout: 0x0102, advertisingData: d, scanResponse: s, into: &w)
                }
            }
        }
        #expect(both == "3E 00 00 00 2E 00 01 03 00 00 00 02 00 02 01 1F 04 " + vector1 + " 03 09 41 42")
    }

    @Test("A writer one byte short: noRoom, nothing written")
    func noRoom() throws {
        let data = hx(vector1)
        for (need, encode) in [(6, { (w: inout ByteWriter) throws(WireError) in
                                    try ManagementCommand.readControllerInformation(index: 0, into: &w) }),
                               (7, { (w: inout ByteWriter) throws(WireError) in
                                    try ManagementCommand.setPowered(index: 0, true, into: &w) })] {
            var storage = [UInt8](repeating: 0xEE, count: need - 1)
            storage.withUnsafeMutableBytes { raw in
                var w = ByteWriter(raw)
                do throws(WireError) {
                    try encode(&w)
                    Issue.record("encoded into \(need - 1) bytes")
                } catch {
                    #expect(error == .noRoom(need: need, have: need - 1))
                }
                #expect(w.count == 0)
            }
            #expect(storage.allSatisfy { $0 == 0xEE })
        }
        data.withUnsafeBytes { d in
            var storage = [UInt8](repeating: 0, count: 47)
            storage.withUnsafeMutableBytes { raw in
                var w = ByteWriter(raw)
                #expect(throws: WireError.noRoom(need: 48, have: 47)) {
                    try ManagementCommand.addAdvertising(index: 0, instance: 1, flags: .connectable, advertisingData: d, into: &w)
                }
            }
        }
        #expect(ManagementCommand.maxEncodedLength == 6 + 11 + 62)
    }

    @Test("Command Complete: opcode, status, and the return parameters as a range into the event")
    func commandComplete() throws {
        // Add Advertising answered for hci1: Instance 5.
        let e = try event("01 00 01 00 04 00 3E 00 00 05")
        #expect(e.code == 0x0001)
        #expect(e.index == 1)
        #expect(e.opcode == 0x003E)
        #expect(e.status == .success)
        #expect(e.returnParameters == 9 ..< 10)
        // Remove Advertising refused: Invalid Parameters, no return parameters.
        let r = try event("01 00 01 00 03 00 3F 00 0D")
        #expect(r.status == .invalidParameters)
        #expect(r.returnParameters.isEmpty)
    }

    @Test("Command Status: opcode and status only; anything after them is trailing")
    func commandStatus() throws {
        let e = try event("02 00 01 00 03 00 3E 00 14")
        #expect(e.opcode == 0x003E)
        #expect(e.status == .permissionDenied)
        #expect(eventError("02 00 01 00 04 00 3E 00 14 00") == .trailing(at: 9, count: 1))
    }

    @Test("Other events (Advertising Added 0x0023) carry no opcode and are skipped by requests")
    func otherEvent() throws {
        let e = try event("23 00 01 00 01 00 05")
        #expect(e.code == 0x0023)
        #expect(e.opcode == nil)
    }

    @Test("Empty, truncated, short and overlong events")
    func malformedEvents() {
        #expect(eventError("") == .truncated(at: 0, need: 2))
        #expect(eventError("01 00 01 00 04") == .truncated(at: 4, need: 1))
        // Declared 4 parameter bytes, 3 present.
        #expect(eventError("01 00 01 00 04 00 3E 00 00") == .truncated(at: 6, need: 1))
        // Declared 3, 4 present.
        #expect(eventError("01 00 01 00 03 00 3E 00 00 05") == .trailing(at: 9, count: 1))
        // A Command Complete too short for its opcode and status.
        #expect(eventError("01 00 01 00 02 00 3E 00") == .truncated(at: 8, need: 1))
    }

    @Test("Read Controller Information: address, version, manufacturer, settings")
    func controllerInformation() throws {
        // btvirt's hci1 (00:AA:01:01:00:01), Bluetooth 5.0, manufacturer 0x05F1 (The Linux
        // Foundation), supported and current settings; the class and names follow (ignored).
        let params = hx("01 00 01 01 AA 00 09 F1 05 FF FE 01 00 C1 02 00 00 00 00 00")
        let info = try params.withUnsafeBytes { try ControllerInformation.parse($0) }
        #expect(info.address == 0x00AA_0101_0001)
        #expect(info.bluetoothVersion == 9)
        #expect(info.manufacturer == 0x05F1)
        #expect(info.supportedSettings.contains(.lowEnergy))
        #expect(info.currentSettings.contains(.powered))
        #expect(info.currentSettings.contains(.advertising) == false)
        #expect(info.usesStaticAddress == false)
        // No public address: the controller advertises from its static random address.
        let none = try hx("00 00 00 00 00 00 09 F1 05 FF FE 01 00 C1 06 00 00")
            .withUnsafeBytes { try ControllerInformation.parse($0) }
        #expect(none.usesStaticAddress)
        let forced = try hx("01 00 01 01 AA 00 09 F1 05 FF FE 01 00 01 82 00 00")
            .withUnsafeBytes { try ControllerInformation.parse($0) }
        #expect(forced.usesStaticAddress)  // bit 15, Static Address
        #expect(throws: WireError.truncated(at: 13, need: 3)) {
            try hx("01 00 01 01 AA 00 09 F1 05 FF FE 01 00 C1").withUnsafeBytes { try ControllerInformation.parse($0) }
        }
    }

    @Test("Read Advertising Features: the highest free instance, none when all are taken")
    func advertisingFeatures() throws {
        func parse(_ hex: String) throws -> AdvertisingFeatures {
            try hx(hex).withUnsafeBytes { try AdvertisingFeatures.parse($0) }
        }
        // 5 instances, bluetoothd holds 1 and 3: 5 is free.
        let f = try parse("7F F0 00 00 1F 1F 05 02 01 03")
        #expect(f.maxInstances == 5)
        #expect(f.maxDataLength == 31)
        #expect(f.isInUse(1) && f.isInUse(3) && !f.isInUse(2) && !f.isInUse(5))
        #expect(f.freeInstance == 5)
        #expect(try parse("7F F0 00 00 1F 1F 05 02 05 04").freeInstance == 3)
        // All five taken (capacity + 1: a sixth set does not exist).
        #expect(try parse("7F F0 00 00 1F 1F 05 05 01 02 03 04 05").freeInstance == nil)
        // A controller that advertises nothing.
        #expect(try parse("00 00 00 00 00 00 00 00").freeInstance == nil)
        // Instance numbers above 63 land in the right word.
        let high = try parse("00 00 00 00 1F 1F FF 02 40 FF")
        #expect(high.isInUse(64) && high.isInUse(255) && !high.isInUse(63))
        #expect(high.freeInstance == 254)
        // A list shorter than its count, or longer.
        #expect(throws: WireError.truncated(at: 9, need: 1)) { try parse("7F F0 00 00 1F 1F 05 02 01") }
        #expect(throws: WireError.trailing(at: 9, count: 1)) { try parse("7F F0 00 00 1F 1F 05 01 01 02") }
    }

    @Test("Status names from mgmt-api.txt's Error Codes, and errors a user can act on")
    func statusAndErrorTexts() {
        #expect(ManagementStatus.permissionDenied.description == "Permission Denied (0x14)")
        #expect(ManagementStatus(rawValue: 0x03).description == "Failed (0x03)")
        #expect(ManagementStatus(rawValue: 0x99).description == "status 0x99")
        let denied = ManagementError.permissionDenied(adapter: "hci1", command: ManagementOpcode.addAdvertising.name)
        #expect(denied.description.hasPrefix("Add Advertising on hci1 needs CAP_NET_ADMIN"))
        #expect(ManagementError.refused(adapter: "hci1", command: "Add Advertising", status: .invalidParameters).description
            == "the kernel refused Add Advertising on hci1: Invalid Parameters (0x0D)")
        #expect(ManagementError.adapterBlocked("hci1").description == "Bluetooth adapter hci1 is blocked by rfkill (`rfkill unblock bluetooth`)")
    }

    @Test("Opening on this kernel: no AF_BLUETOOTH says so; with Bluetooth (the VM), hci99 is not found")
    func openOnThisKernel() throws {
        let probe = socket(AF_BLUETOOTH, Int32(SOCK_RAW.rawValue) | Int32(SOCK_CLOEXEC.rawValue), BTPROTO_HCI)
        let probeErrno = errno
        if probe < 0 {
            try #require(probeErrno == EAFNOSUPPORT, "socket(AF_BLUETOOTH) failed with errno \(probeErrno), not EAFNOSUPPORT")
            #expect(throws: ManagementError.noBluetoothSupport) { _ = try ManagementSocket(adapter: "hci0") }
            #expect(ManagementError.noBluetoothSupport.description
                == "this kernel has no Bluetooth support, or a sandbox denies it (AF_BLUETOOTH unavailable; a systemd unit needs AF_BLUETOOTH in RestrictAddressFamilies=): run on a machine with BlueZ")
        } else {
            Glibc.close(probe)
            // The kernel answers a command for a controller it does not have with Invalid Index.
            var socket = try ManagementSocket(adapter: "hci99")
            #expect(throws: ManagementError.adapterNotFound("hci99")) { _ = try socket.controllerInformation() }
        }
        #expect(throws: ManagementError.adapterNotFound("bt0")) { _ = try ManagementSocket(adapter: "bt0") }
    }
}
