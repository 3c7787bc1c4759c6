// core/host_identity.h: the identity ranks compare to find their host's
// peers, and the host's IPv4 interfaces (HORA_GLOO_IFACE's check, the tcp
// ring's address).
#include "core/host_identity.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace hora {
namespace {

TEST(HostIdentityTest, EqualInOneProcessAndOverriddenForTests) {
  EXPECT_EQ(hostIdentity(), hostIdentity());
  EXPECT_EQ(hostIdentity("", "10.0.0.1"), hostIdentity());
  EXPECT_EQ(hostIdentity("hostA", "10.0.0.1"), hostIdentity("hostA", "10.0.0.2"));
  EXPECT_NE(hostIdentity("address", "10.0.0.1"), hostIdentity("address", "10.0.0.2"));
}

TEST(HostIdentityTest, TheBootIdIsSharedByIdentitiesOfOneKernelOnly) {
  const std::string boot = bootIdOf(hostIdentity());
  EXPECT_FALSE(boot.empty()) << hostIdentity();
  EXPECT_EQ(bootIdOf("other-host/" + boot), boot);  // another UTS namespace, same kernel
  EXPECT_EQ(bootIdOf("h/a/b"), "b");
  for (const std::string id : {"-", "", "no-slash", "id:h/x", "address:10.0.0.1"})
    EXPECT_EQ(bootIdOf(id), "") << id;
  EXPECT_EQ(bootIdOf(hostIdentity("hostA", "10.0.0.1")), "");
  EXPECT_EQ(bootIdOf(hostIdentity("address", "10.0.0.1")), "");
}

TEST(HostIdentityTest, KernelCountsParseAsPositiveDecimalsOnly) {
  int n = -1;
  EXPECT_TRUE(parseKernelCount("4", &n));
  EXPECT_EQ(n, 4);
  EXPECT_TRUE(parseKernelCount("123456789", &n));
  EXPECT_EQ(n, 123456789);
  for (const std::string bad : {"", "0", "-3", "+3", "3 ", "x", "1234567890"}) {
    n = 7;
    EXPECT_FALSE(parseKernelCount(bad, &n)) << bad;
    EXPECT_EQ(n, 7) << bad;
  }
}

TEST(Ipv4InterfacesTest, ListsTheLoopbackWithItsAddress) {
  std::map<std::string, std::string> interfaces;
  ASSERT_TRUE(ipv4Interfaces(&interfaces));
  ASSERT_EQ(interfaces.count("lo"), 1u);
  EXPECT_EQ(interfaces["lo"].rfind("127.", 0), 0u) << interfaces["lo"];
  EXPECT_EQ(interfaces.count("no-such-nic0"), 0u);
}

}  // namespace
}  // namespace hora
