package zklock_test

const holderEnv = "ZKLOCK_TEST_HOLDER"

func holderMain() {}
